#!/usr/bin/env bash
# On the GPU machine, after setup.sh: `bass bench speed` for the current build only, over a
# grid of batches and policies (e.g. where `auto` stands against every fixed k). Usage:
#   sweep.sh MODE BATCHES POLICIES [--services]   (e.g. greedy 1,2,4,8,16,32,64 0,2,3,4,5,6,auto)
# Extra arguments go to `bass bench speed`; TAG names the files; LIMIT_S bounds the run (default 300).
set -uo pipefail
mode=$1 batches=$2 policies=$3; shift 3
cd /tmp
export PYTHONUNBUFFERED=1
BASS_COMMIT=${BASS_COMMIT:-} PYTHONPATH=/tmp/site timeout ${LIMIT_S:-300} python3 -m bass.cli bench speed \
  --target /tmp/models/qwen2.5-coder-1.5b-instruct --draft /tmp/models/qwen2.5-coder-0.5b-instruct \
  --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
  --batches $batches --policies $policies --mode $mode "$@" --out $OUT/sweep-$mode${TAG:-}.json \
  > /dev/null 2> $OUT/sweep-$mode${TAG:-}.log
python3 - "$OUT/sweep-$mode${TAG:-}.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
for r in rows:
    print(r["mode"], "services" if r["services"] else "in-process", "batch", r["batch"], "policy", r["policy"],
          r["ms_per_token_per_sequence"], "ms/token/seq", r["tokens_per_sequence_step"], "tokens/step",
          "steps", r["steps"], r["step_stats"]["breakdown_ms_per_step"])
PY
