#!/usr/bin/env bash
# On the GPU machine, no models needed: what programmatic dependent launch of the Triton kernels
# saves (random weights at the real shapes). `bass bench steps` (single forwards, CUDA graphs)
# with and without it, twice each in alternation, then worker_calls.py (a Propose and a Verify
# inside the workers) off / on / off / on. JSON under $OUT. BATCHES picks the batch sizes.
set -uo pipefail
R=$PWD
bash bench/gpu/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
B=${BATCHES:-1,8,64}
timeout ${STEPS_TIMEOUT:-200} python3 -m bass.cli bench steps --batches $B --draft-lengths 4 --repeats 50 \
  --configs triton:graphs:nodl,triton:graphs,triton:graphs:nodl,triton:graphs --out $OUT/steps.json 2>&1 \
  | grep -v -i warn | tail -12
n=0
for dl in ${CALLS:-off on off on}; do
  n=$((n + 1))
  timeout ${CALLS_TIMEOUT:-150} python3 $R/bench/gpu/worker_calls.py --batches $B --repeats 15 --label dl-$dl \
    --dependent-launch $dl --out $OUT/worker-calls-$n-$dl.json 2>&1 | grep '^{'
done
