#!/usr/bin/env bash
# On the GPU machine, no models needed: what prefetching a fused layer's later weights into L2
# saves a forward (bench/gpu/kernels/l2_prefetch.py), for the 1.5B target and the int8 0.5B draft
# with random weights; then the few-row kernel's GPU tests (the prefetch must leave every value as
# it was). Writes $OUT/l2-prefetch.{json,txt} and $OUT/gpu-tests-cuda-skinny.txt.
# ROLES (default target-cuda,draft-fused), CASES (BxQ,...) and SETTINGS pass through.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${LIMIT_S:-420} python3 $R/bench/gpu/kernels/l2_prefetch.py $OUT/l2-prefetch.json ${ROLES:-target-cuda,draft-fused} \
  ${CASES:-1x1,8x1,1x4,2x4,4x4} > $OUT/l2-prefetch.txt 2>&1
echo "l2_prefetch.py exit $?" >> $OUT/l2-prefetch.txt
if [ "${TESTS:-1}" = 1 ]; then
  cd $R && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_skinny.py > $OUT/gpu-tests-cuda-skinny.txt 2>&1
fi
cat $OUT/l2-prefetch.txt
