#!/usr/bin/env bash
# On the GPU machine, after setup/setup.sh: the target's lookup tail (engine/lookup_tail.py) off
# and on, in-process and through the services (`bass serve`'s default, the draft co-located), one
# process each, the services' order swapped to show a process-order bias. Usage:
#   lookup_tail.sh MODE BATCHES POLICIES [TAIL]   (e.g. greedy 1,8 3,auto 2)
# LIMIT_S bounds each process; DEPLOYMENTS (default "inproc services") picks the deployments.
set -uo pipefail
mode=$1 batches=$2 policies=$3 tail=${4:-2}
cd /tmp  # run the installed package, not the checkout's
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
for deployment in ${DEPLOYMENTS:-inproc services}; do
  case $deployment in
    inproc) flags=() order="0 $tail" ;;
    services) flags=(--services) order="$tail 0" ;;
  esac
  for t in $order; do
    name=tail-$mode-$deployment-t$t
    timeout ${LIMIT_S:-200} python3 -m bass.cli bench speed --target $T --draft $D --device cuda:0 "${flags[@]}" \
      --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --batches $batches \
      --policies $policies --mode $mode --lookup-tail $t --repeats 3 --out $OUT/$name.json > /dev/null 2> $OUT/$name.log
    echo "$name: exit $?"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/tail-*.json")):
    d = json.load(open(path))
    for r in d["results"]:
        st = r["step_stats"]
        print(f"{path.split('/')[-1][:-5]} batch {r['batch']} policy {r['policy']}: "
              f"{r['ms_per_token_per_sequence']:.3f} ms/token/seq, steps {r['steps']}, "
              f"tokens/seq-step {r['tokens_per_sequence_step']}, tail kept {st['lookup_tail_kept']}, "
              f"verify {st['breakdown_ms_per_step']['verify_ms']:.3f} ms, outputs {r['outputs_digest_per_round'][-1]}")
PY
