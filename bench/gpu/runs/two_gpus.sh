#!/usr/bin/env bash
# On a machine with two GPUs, after setup/setup.sh: issue #36's comparison in one call. The same
# `bass bench speed` through the services with both models on GPU 0 (today's one-GPU default),
# then with the draft on GPU 1 (sequential speculation through the host, and streamed
# speculation: the draft drafts ahead on its own, the target verifies what it streamed). Usage:
#   two_gpus.sh MODE BATCHES ONE_GPU_POLICIES TWO_GPU_POLICIES   (e.g. greedy 1,8 3,auto 3,stream6,stream4c2)
# LIMIT_S bounds each process; extra arguments go to all. PLACEMENTS (default "one two") may add
# "here": the draft on GPU 1 in a process of its own, the target in the coordinator's process
# (no Verify round trip), with the two-GPU policies.
set -uo pipefail
mode=$1 batches=$2 one=$3 two=$4; shift 4
cd /tmp  # run the installed package, not the checkout's
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
# One GPU: `bass serve`'s default (the draft in the target's process). Two: the draft in a
# process of its own on GPU 1, as `bass serve --draft-device cuda:1` runs it.
for placement in ${PLACEMENTS:-one two}; do
  case $placement in
    one) policies=$one flags=(--services --draft-device cuda:0) ;;
    two) policies=$two flags=(--services --separate-draft --draft-device cuda:1) ;;
    here) policies=$two flags=(--separate-draft --draft-device cuda:1) ;;
  esac
  timeout ${LIMIT_S:-300} python3 -m bass.cli bench speed --target $T --draft $D --device cuda:0 \
    "${flags[@]}" --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 \
    --batches $batches --policies $policies --mode $mode "$@" \
    --out $OUT/two-gpus-$mode-$placement.json > /dev/null 2> $OUT/two-gpus-$mode-$placement.log
  echo "$placement GPU(s): exit $?"
done
python3 - "$OUT" "$mode" <<'PY'
import json, os, sys
out, mode = sys.argv[1:]
for placement in os.environ.get("PLACEMENTS", "one two").split():
    path = f"{out}/two-gpus-{mode}-{placement}.json"
    if not os.path.exists(path):
        print(placement, "GPU(s): no result (see the .log)")
        continue
    for r in json.load(open(path))["results"]:
        print(f"{mode} {placement} GPU(s) batch {r['batch']} policy {r['policy']}: "
              f"{r['ms_per_token_per_sequence']:.3f} ms/token/seq, steps {r['steps']}, "
              f"tokens/seq-step {r['tokens_per_sequence_step']}, outputs {r['outputs_digest_per_round'][-1]}")
PY
