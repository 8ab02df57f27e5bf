#!/usr/bin/env bash
# On the GPU machine, no models needed: the attention's early key tile (kernels/triton_attention.py,
# prefetch) — its GPU tests, then forwards' GPU time with it and without it, programmatic launch
# on (bench/gpu/kernels/programmatic_launch.py). Output under $OUT.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider $R/tests/test_triton_attention.py \
  $R/tests/test_eager_variants.py "$R/tests/test_cuda_skinny.py" -k "not build_kernels" 2>&1 | tail -15 > $OUT/tests.txt
cat $OUT/tests.txt
cd $R/bench/gpu/kernels
SETTINGS=${SETTINGS:-both,both-noprefetch} timeout ${BENCH_TIMEOUT:-300} python3 programmatic_launch.py \
  $OUT/prefetch.json ${ROLES:-draft-fused,target-cuda} ${QS:-1,4} 2>&1 | grep -v Warning | tail -20
