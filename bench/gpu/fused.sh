#!/usr/bin/env bash
# On the GPU machine, no models needed (issue #12, the fused projections): their GPU tests, the
# per-projection sweep (fused_linear.py), then Propose / Verify / a regular step inside the
# workers with the fused projections off and on, in one run (worker_calls.py). Output under $OUT.
set -uo pipefail
R=$PWD
bash bench/gpu/install.sh >/dev/null
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider $R/tests/test_triton_fused_linear.py \
  $R/tests/test_gpu.py $R/tests/test_triton_elementwise.py $R/tests/test_draft_loop.py 2>&1 | tail -15 > $OUT/gpu-tests.txt
cat $OUT/gpu-tests.txt
timeout ${SWEEP_TIMEOUT:-150} python3 $R/bench/gpu/fused_linear.py --out $OUT/fused-linear-sweep.json 2>&1 | tail -40
calls=(python3 $R/bench/gpu/worker_calls.py --batches ${BATCHES:-1,8,64} --repeats 15)
for mode in off on; do
  timeout ${CALLS_TIMEOUT:-200} "${calls[@]}" --label fused-$mode --fused-linear $mode \
    --out $OUT/worker-calls-fused-$mode.json 2>&1 | grep '^{\|Error\|error' | tail -12
done
