#!/usr/bin/env bash
# On the GPU machine, after setup.sh: HF transformers baselines on the same prompts as speed.sh
# (greedy, 128 new tokens): eager at batch 1 and 8, static cache + torch.compile at batch 8.
set -uo pipefail
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
hf=(python3 -m bass.cli bench hf --model /tmp/models/qwen2.5-coder-1.5b-instruct --problems 0:16 --device cuda
    --dtype bfloat16)
[ "${1:-}" = "static-only" ] || timeout 60 "${hf[@]}" --batches 1,8 --out $OUT/hf-eager.json > /dev/null
timeout 300 "${hf[@]}" --batches 8 --static-compile --out $OUT/hf-static.json > /dev/null 2> $OUT/hf-static.log
tail -5 $OUT/hf-static.log
