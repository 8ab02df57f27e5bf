#!/usr/bin/env bash
# On the GPU machine, after setup.sh: one build, one `bass bench speed --services` flag against
# another, alternated in separate processes (A B A B ...: process-order drift shows up as a
# disagreement between rounds), on the README's bench (first 16 HumanEval prompts, 128 new
# tokens). Usage: flag_ab.sh MODE "FLAG_A" "FLAG_B" [ROUNDS]   (e.g. greedy --no-programmatic-launch
# --programmatic-launch 2); BATCHES (default 1,8), POLICIES (default 3,auto), REPEATS (default 5).
set -uo pipefail
mode=$1 a=$2 b=$3 rounds=${4:-2}
R=$PWD
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=${PYTHONPATH:-/tmp/site} PYTHONUNBUFFERED=1
[ "${WARM:-1}" = 1 ] && bash $R/bench/gpu/runs/warm_kernels.sh $mode  # WARM=0: no untimed process first
for round in $(seq 1 $rounds); do
  for flag in "$a" "$b"; do
    name=$OUT/speed-$mode-${flag//[^a-z0-9-]/}-r$round
    timeout ${LIMIT_S:-200} python3 -m bass.cli bench speed --target /tmp/models/qwen2.5-coder-1.5b-instruct \
      --draft /tmp/models/qwen2.5-coder-0.5b-instruct --device cuda --dtype bfloat16 --max-seq-len 1024 \
      --max-new-tokens 128 --problems 0:16 --batches ${BATCHES:-1,8} --policies ${POLICIES:-3,auto} \
      --repeats ${REPEATS:-5} --mode $mode --services $flag --out $name.json > /dev/null 2> $name.log
    python3 - $name.json "$flag" $round <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    b = r["step_stats"]["breakdown_ms_per_step"]
    print(f"round {sys.argv[3]} {sys.argv[2]} {r['mode']} batch {r['batch']} policy {r['policy']}: "
          f"{r['ms_per_token_per_sequence']:.3f} ms/token/seq (mean {r.get('ms_per_token_per_sequence_mean', 0):.3f}), "
          f"{r['tokens_per_sequence_step']:.2f} tokens a sequence-step, step {b['step_ms']:.2f} ms "
          f"(slowest {1000 * r['step_stats'].get('slowest_step_s', 0):.1f}) "
          f"{ {k: round(v, 2) for k, v in b.items() if k != 'step_ms'} } digests {r.get('outputs_digest_per_round', '')}")
PY
  done
done
