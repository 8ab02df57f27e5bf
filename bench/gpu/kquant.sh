#!/usr/bin/env bash
# On the GPU machine, no models needed (issue #12): does reading the target's k-quant blocks pay?
# The k-quant and int8 tests (the real bf16 cast, batch invariance, the shared split K), the
# kernel against cuBLAS per projection at 1-64 rows with a walk over tilings at 8 rows, then
# `bass bench steps` (random
# weights at the 1.5B's shapes, CUDA graphs) with and without --target-kquant in one process
# each. Output under $OUT; about 6-8 minutes.
set -uo pipefail
R=$PWD
bash bench/gpu/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# test_triton_int8.py too: the int8 kernel's split K moved into kernels/triton_splitk.py unmeasured.
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider $R/tests/test_triton_kquant.py \
  $R/tests/test_kquant_model.py $R/tests/test_triton_int8.py 2>&1 | tail -15 > $OUT/kquant-tests.txt
cat $OUT/kquant-tests.txt
(cd $R/bench/gpu && timeout ${LINEAR_TIMEOUT:-200} python3 kquant_linear.py $OUT/kquant-linear.jsonl --grid \
  > $OUT/kquant-linear.log 2>&1)
grep -v grid_tiling $OUT/kquant-linear.jsonl
for variant in bf16 kquant; do
  flag=$([ $variant = kquant ] && echo --target-kquant)
  timeout ${STEPS_TIMEOUT:-120} python3 -m bass.cli bench steps --configs triton:graphs --batches ${BATCHES:-1,8,64} \
    --draft-lengths 4 --repeats 30 $flag --out $OUT/steps-$variant.json 2>&1 | tail -4
done
