#!/usr/bin/env bash
# On the GPU machine, after setup.sh (whose conversion writes gguf_blocks/): issue #12's end-to-end
# check of the target reading its k-quant blocks. `bass bench speed` without and with
# --target-kquant, in-process, then again in the other order (a process each, so the order's
# effect shows), for one mode. Usage:
#   kquant_speed.sh MODE BATCHES POLICIES   (e.g. greedy 1,8,64 0,auto)
# LIMIT_S bounds each run (default 150); extra arguments go to every run (e.g. --services).
set -uo pipefail
mode=$1 batches=$2 policies=$3; shift 3
cd /tmp
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
run=0
for variant in bf16 kquant kquant bf16; do
  run=$((run + 1))
  flag=$([ $variant = kquant ] && echo --target-kquant)
  timeout ${LIMIT_S:-150} python3 -m bass.cli bench speed --target $T --draft $D --device cuda --dtype bfloat16 \
    --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 --batches $batches \
    --policies $policies --mode $mode $flag "$@" --out $OUT/kquant-speed-$mode-$run-$variant.json \
    > /dev/null 2> $OUT/kquant-speed-$mode-$run-$variant.log
done
python3 - "$OUT" "$mode" <<'PY'
import glob, json, sys
out, mode = sys.argv[1:]
for path in sorted(glob.glob(f"{out}/kquant-speed-{mode}-*.json")):
    for row in json.load(open(path))["results"]:
        print(path.rsplit("/", 1)[-1], row.get("policy"), row.get("batch"), row.get("ms_per_token_per_sequence"))
PY
