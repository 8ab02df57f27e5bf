#!/usr/bin/env bash
# On the GPU machine, no models needed: the 17-64-row fused layer products (kernels/
# triton_layer_products.py): their GPU tests, then bench/gpu/kernels/layer_products.py (tilings
# against cuBLAS, whole forwards fused against unfused past 16 rows). Output under $OUT.
# PARTS (products,forwards), ROWS (32,64), TESTS (extra test files) and the time limits as env.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider $R/tests/test_layer_products.py ${TESTS:-} 2>&1 \
  | tail -25 > $OUT/layer-products-tests.txt
cat $OUT/layer-products-tests.txt
[ "${BENCH_TIMEOUT:-360}" = 0 ] && exit 0
cd $R/bench/gpu/kernels
timeout ${BENCH_TIMEOUT:-360} python3 layer_products.py $OUT/layer-products.json ${PARTS:-products,forwards} ${ROWS:-32,64} 2>&1 \
  | grep -v Warning | tail -80
