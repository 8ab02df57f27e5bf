#!/usr/bin/env bash
# On the GPU machine, no models needed: where a regular step's host time goes. The target
# worker's host work a regular step as served (bf16, CUDA graphs, random weights at the 1.5B's
# shape; bench/cpu/worker_host.py --device cuda, with its cProfile at the largest batch), then
# whether the coordinator and the transport keep a stand-in GPU step fed on this machine's CPU
# (bench/cpu/regular_period.py, with the tiny tokenizer unless TOKENIZER names a model directory).
# BATCHES (default 8,64), T_MS (default 1.5). Output under $OUT.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -f /tmp/rp/qwen2.5-coder-1.5b-random/config.json ] || timeout 120 python3 $R/bench/gpu/setup/random_pair.py /tmp/rp > /dev/null
timeout 240 python3 $R/bench/cpu/worker_host.py --device cuda --model /tmp/rp/qwen2.5-coder-1.5b-random \
  --batches ${BATCHES:-8,64} --profile --out $OUT/worker-host.json 2>&1 | grep -v "^\s*$" | head -40
timeout 120 python3 $R/bench/cpu/regular_period.py --batches ${BATCHES:-8,64} --t-ms ${T_MS:-1.5} \
  ${TOKENIZER:+--tokenizer $TOKENIZER} --out $OUT/regular-period.json 2>&1 | tail -3
# The same for speculative steps over a co-located pair, with steps sent ahead and without
# (bench/cpu/speculative_period.py: stand-in GPU work of H200-like lengths).
timeout 150 python3 $R/bench/cpu/speculative_period.py --batches 1,8 --lengths 2,3,4 \
  --out $OUT/speculative-period.json 2>&1 | tail -12
