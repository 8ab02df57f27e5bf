#!/usr/bin/env bash
# On the GPU machine, after setup.sh: GPU tests, draft acceptance on all of HumanEval, and a
# first speed figure (regular vs speculative) in our engine. Writes JSON under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
M=/tmp/models
T=$M/qwen2.5-coder-1.5b-instruct
D=$M/qwen2.5-coder-0.5b-instruct
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 | tee $OUT/gpu-tests.txt
common=(--target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128)
# speed first (batch 8 = 8 distinct prompts, greedy), then acceptance on all 164 problems x 8 samples
python3 -m bass.cli bench acceptance "${common[@]}" --problems 0:16 -n 1 --batch-prompts 8 \
  --draft-lengths 0,bass,2,4,8 --modes greedy --out $OUT/speed-first16-b8.json > /dev/null
python3 -m bass.cli bench acceptance "${common[@]}" --problems all -n 8 --batch-prompts 8 \
  --draft-lengths bass --modes greedy,t0.8-p0.95 --out $OUT/acceptance-humaneval164-n8.json > /dev/null
ls -la $OUT
