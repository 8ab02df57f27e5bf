#!/usr/bin/env bash
# On a machine with N GPUs, after setup.sh (issue #37): what replicas behind the router give.
#   alone:    one replica (`bass serve`), no router: the baseline;
#   router:   the same replica behind `bass router` (one replica): the router's cost per token,
#             TTFT and TPOT p50 against `alone` (target: <= 0.1 ms p50 added to a token);
#   replicas: `bass serve --replicas N` (N replicas, a GPU each, behind the router);
#   streamed: one replica on two GPUs, the draft on GPU 1 streaming ahead (`--draft-device cuda:1
#             --draft-stream 6`, issue #36's load targets against `alone` and `replicas` with N = 2);
#   kill:     N replicas at half their saturation rate, one replica's coordinator killed under load
#             (`bass serve` starts it again): only its in-flight requests may fail, every other
#             answer still equals its reference (sent alone first; exact with BATCH_INVARIANT=1).
# Each of alone / router / replicas runs the same HumanEval prompts (256 new tokens, greedy):
# open-loop Poisson arrivals at RATES x the replica count, then closed loop at CONCURRENCY x the
# replica count (saturation throughput: target N replicas >= 3.6 x one replica's, speculative and
# regular). Targets: bench/results "replicas", with the GPU, the commit and this command.
# Usage: bash bench/gpu/runs/replicas.sh [N]      (N: replicas, default 4; N GPUs needed)
# Overrides: PARTS (default "alone router replicas kill"; "streamed" on request, STREAM=K its block; a part takes about 4-6 minutes with
# COMPARE_REGULAR and one call runs at most 10, so run one part per call: PARTS=alone, then
# PARTS=router, PARTS=replicas, PARTS=kill, on the same warm machine), RATES (per replica, requests/s;
# default 9,18,27,36), CONCURRENCY (per replica, default 64), DURATION (s of arrivals per rate,
# default 8), PROBLEMS (default 0:64), COMPARE_REGULAR (default 1: regular decoding on the same
# arrivals too), BATCH_INVARIANT (1: --batch-invariant for the kill part).
# Writes $OUT/replicas-*/serve.{json,md,png} and logs, and $OUT/replicas.tgz of them all.
set -uo pipefail
n=${1:-4}
parts=${PARTS:-alone router replicas kill}
rates=${RATES:-9,18,27,36} concurrency=${CONCURRENCY:-64} duration=${DURATION:-8} problems=${PROBLEMS:-0:64}
R=$PWD
W=/tmp/replicas-out && mkdir -p $W
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
models=(--target $T --draft $D --device cuda)
regular=(); [ "${COMPARE_REGULAR:-1}" = 1 ] && regular=(--compare-regular)
nvidia-smi --query-gpu=index,name,memory.total --format=csv > $W/gpus.csv; cat $W/gpus.csv
# The wheel is what runs (the GPU machine's copy of .git may be stale: it said 1af62b6 for 7852345).
cp $R/.whl/COMMIT $W/commit 2>/dev/null || git -C $R rev-parse HEAD > $W/commit 2>/dev/null

wait_serving() {  # ADDRESS LOG: until a one-token request through ADDRESS answers (10 minutes at most)
  for _ in $(seq 600); do
    python3 -m bass.cli client --address $1 --prompt-ids 1,2 --max-new-tokens 1 --timeout 2 > /dev/null 2>&1 && return 0
    sleep 1
  done
  echo "nothing answered on $1 within 600 s (log: $2)" >&2
  return 1
}

scale() {  # LIST FACTOR: each number of a comma-separated list times FACTOR
  python3 -c "import sys; print(','.join(f'{float(x) * int(sys.argv[2]):g}' for x in sys.argv[1].split(',')))" "$1" "$2"
}

bench() {  # NAME REPLICAS: open loop at RATES x REPLICAS, then closed loop at CONCURRENCY x REPLICAS
  local name=$1 k=$2
  python3 -m bass.cli bench serve --address 127.0.0.1:50051 --rates $(scale $rates $k) --duration $duration \
    --num-requests $((512 * k)) --problems $problems --max-new-tokens 256 --temperature 0 "${regular[@]}" \
    --no-progress --out $W/replicas-$name-open 2> $W/replicas-$name-open.log
  tail -4 $W/replicas-$name-open.log
  python3 -m bass.cli bench serve --address 127.0.0.1:50051 --concurrency $((concurrency * k)) \
    --num-requests $((4 * concurrency * k)) --problems $problems --max-new-tokens 256 --temperature 0 \
    "${regular[@]}" --no-progress --out $W/replicas-$name-closed 2> $W/replicas-$name-closed.log
  tail -4 $W/replicas-$name-closed.log
}

listening_pid() {  # PORT: the process listening on it (from /proc: its socket's inode among the fds)
  python3 - "$1" <<'EOT'
import os, sys
port = int(sys.argv[1])
inodes = {row.split()[9] for t in ("/proc/net/tcp", "/proc/net/tcp6") for row in open(t).read().splitlines()[1:]
          if int(row.split()[1].rsplit(":", 1)[1], 16) == port and row.split()[3] == "0A"}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if any(os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
            print(pid)
            break
    except OSError:
        continue
EOT
}

stop() {  # PID...: SIGINT, as Ctrl-C would (each stops its children), then wait
  kill -INT "$@" 2> /dev/null; wait "$@" 2> /dev/null
}

for part in $parts; do
  case $part in
    alone)
      python3 -m bass.cli serve "${models[@]}" --port 50051 > $W/serve-alone.log 2>&1 & s=$!
      wait_serving 127.0.0.1:50051 $W/serve-alone.log && bench alone 1
      stop $s ;;
    router)
      # The replica on 50052, the router on the public port in front of it alone.
      python3 -m bass.cli serve "${models[@]}" --port 50052 > $W/serve-router.log 2>&1 & s=$!
      wait_serving 127.0.0.1:50052 $W/serve-router.log
      python3 -m bass.cli router --replica 127.0.0.1:50052 --port 50051 --metrics-port 9465 > $W/router.log 2>&1 & r=$!
      wait_serving 127.0.0.1:50051 $W/router.log && bench router 1
      curl -s 127.0.0.1:9465/metrics | grep '^bass_' > $W/router-metrics.txt
      stop $r; stop $s ;;
    replicas)
      python3 -m bass.cli serve "${models[@]}" --replicas $n --port 50051 --metrics-port 9465 \
        > $W/serve-replicas.log 2>&1 & s=$!
      wait_serving 127.0.0.1:50051 $W/serve-replicas.log && bench replicas-$n $n
      curl -s 127.0.0.1:9465/metrics | grep '^bass_' > $W/replicas-$n-metrics.txt
      stop $s ;;
    streamed)
      python3 -m bass.cli serve "${models[@]}" --draft-device cuda:1 --draft-stream ${STREAM:-6} --port 50051 \
        --metrics-port 9465 > $W/serve-streamed.log 2>&1 & s=$!
      wait_serving 127.0.0.1:50051 $W/serve-streamed.log && bench streamed 1
      curl -s 127.0.0.1:9465/metrics | grep '^bass_' > $W/streamed-metrics.txt
      stop $s ;;
    kill)
      flags=(); [ "${BATCH_INVARIANT:-0}" = 1 ] && flags=(--batch-invariant)
      python3 -m bass.cli serve "${models[@]}" "${flags[@]}" --replicas $n --port 50051 --metrics-port 9465 \
        > $W/serve-kill.log 2>&1 & s=$!
      wait_serving 127.0.0.1:50051 $W/serve-kill.log || { stop $s; continue; }
      half=$(python3 -c "print(max(float(x) for x in '$rates'.split(',')) / 2 * $n)")
      python3 -m bass.cli bench serve --address 127.0.0.1:50051 --rates $half --duration 20 \
        --num-requests 100000 --problems $problems --max-new-tokens 256 --temperature 0 --no-progress \
        --out $W/replicas-kill 2> $W/replicas-kill.log & b=$!
      # Once the references (each distinct request sent alone first) are done and the load runs:
      # the router has forwarded the references and 20 more.
      refs=$(python3 -c "a, b = '$problems'.split(':'); print(int(b) - int(a))")
      for _ in $(seq 600); do
        done_=$(curl -s 127.0.0.1:9465/metrics | awk '/^bass_router_requests_total/ {s += $2} END {print int(s)}')
        [ "${done_:-0}" -ge $((refs + 20)) ] && break
        sleep 1
      done
      victim=$(grep -m1 '"service": "replica"' $W/serve-kill.log | python3 -c "import json, sys; print(json.loads(sys.stdin.read())['address'].rsplit(':', 1)[1])")
      pid=$(listening_pid $victim)
      echo "killing the coordinator of replica 0 (port $victim, pid $pid) at $(date +%T)" | tee $W/kill.txt
      kill -KILL $pid
      wait $b
      tail -8 $W/replicas-kill.log
      curl -s 127.0.0.1:9465/metrics | grep '^bass_' > $W/replicas-kill-metrics.txt
      stop $s ;;
    *) echo "unknown part $part" >&2 ;;
  esac
done
grep -h "saturation\|throughput\|p50" $W/replicas-*/serve.md 2> /dev/null | head -40
tar -C /tmp -czf $OUT/replicas.tgz replicas-out
