#!/usr/bin/env bash
# On the GPU machine, after setup.sh: draft acceptance on all 164 HumanEval prompts x 8 samples
# at T = 0.8, top-p 0.95, k = 4 (issue #3). JSON under $OUT. MODES=greedy,t0.8-p0.95 adds greedy
# (what the retired issue3.sh also ran; greedy is deterministic, so its 8 samples agree).
set -uo pipefail
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
M=/tmp/models
python3 -m bass.cli bench acceptance --target $M/qwen2.5-coder-1.5b-instruct --draft $M/qwen2.5-coder-0.5b-instruct \
  --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems all -n 8 --batch-prompts 8 \
  --draft-lengths 4 --modes ${MODES:-t0.8-p0.95} --out $OUT/acceptance-humaneval164x8.json > /dev/null
