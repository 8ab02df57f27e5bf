#!/usr/bin/env bash
# On the GPU machine, no models needed: install the wheels, run every GPU and Triton test, then
# the batch-invariant GEMM sweep (gemm_invariant.py). Output under $OUT.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $R/tests/test_gpu.py \
  $R/tests/test_batch_invariant.py $R/tests/test_triton_sampling.py $R/tests/test_triton_attention.py \
  $R/tests/test_triton_elementwise.py $R/tests/test_draft_loop.py $R/tests/test_target_run_ahead.py \
  $R/tests/test_verify_tail.py $R/tests/test_device_drafts.py $R/tests/test_chained_drafts.py \
  $R/tests/test_colocated.py $R/tests/test_triton_int8.py $R/tests/test_cuda_skinny.py $R/tests/test_lookup_tail.py $R/tests/test_prefill_graphs.py \
  $R/tests/test_eager_variants.py \
  "$R/tests/test_streamed_speculation.py::test_a_run_of_extensions_drafts_what_one_proposal_drafts" \
  "$R/tests/test_streamed_speculation.py::test_a_release_while_an_extension_is_in_flight_on_the_gpu" 2>&1 \
  | tail -25 > $OUT/gpu-tests.txt
cat $OUT/gpu-tests.txt
[ "${GEMM_TIMEOUT:-200}" = 0 ] && exit 0  # GEMM_TIMEOUT=0: the tests alone
timeout ${GEMM_TIMEOUT:-200} python3 $R/bench/gpu/kernels/gemm_invariant.py --out $OUT/gemm-invariant.json 2>&1 | tail -40
