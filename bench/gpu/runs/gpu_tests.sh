#!/usr/bin/env bash
# On the GPU machine, no models needed: install the wheels, run every GPU and Triton test, then
# the batch-invariant GEMM sweep (gemm_invariant.py). Output under $OUT. PART: see below.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# The suite outgrew one call (cut off at 420 s on an H200, 2026-11-28): PART=1 or PART=2 runs
# one part of it (the kernels and test_gpu.py; the draft loop and the workers), PART=all (the
# default) both in one call.
PART1=(test_gpu.py test_batch_invariant.py test_triton_sampling.py test_triton_attention.py
       test_triton_elementwise.py test_eager_variants.py test_prefill_graphs.py)
PART2=(test_draft_loop.py test_target_run_ahead.py test_verify_tail.py test_device_drafts.py
       test_chained_drafts.py test_colocated.py test_triton_int8.py test_cuda_skinny.py test_lookup_tail.py
       "test_streamed_speculation.py::test_a_run_of_extensions_drafts_what_one_proposal_drafts"
       "test_streamed_speculation.py::test_a_release_while_an_extension_is_in_flight_on_the_gpu")
case "${PART:-all}" in
  1) FILES=("${PART1[@]}") ;;
  2) FILES=("${PART2[@]}") ;;
  all) FILES=("${PART1[@]}" "${PART2[@]}") ;;
  *) echo "PART must be 1, 2 or all, got '$PART'" >&2; exit 2 ;;
esac
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider "${FILES[@]/#/$R/tests/}" 2>&1 \
  | tail -25 > $OUT/gpu-tests.txt
cat $OUT/gpu-tests.txt
[ "${GEMM_TIMEOUT:-200}" = 0 ] && exit 0  # GEMM_TIMEOUT=0: the tests alone
timeout ${GEMM_TIMEOUT:-200} python3 $R/bench/gpu/kernels/gemm_invariant.py --out $OUT/gemm-invariant.json 2>&1 | tail -40
