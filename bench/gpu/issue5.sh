#!/usr/bin/env bash
# On the GPU machine (no model files needed): GPU tests, step costs with random weights at the
# real shapes, the attention kernel sweep. Each writes JSON under $OUT as soon as it finishes.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cp -r bass/v1 /tmp/site/bass/
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider -x $R/tests/test_gpu.py $R/tests/test_triton_attention.py 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
timeout 300 python3 -m bass.cli bench steps --batches 1,8,32,64 --draft-lengths 1,2,3,4,6,8 --repeats 20 \
  --out $OUT/steps-1.5b-0.5b.json > /dev/null
timeout 150 python3 -m bass.cli bench steps --target qwen2.5-coder-7b --batches 1,8,64 --draft-lengths 2,4,6,8 \
  --configs triton:graphs --repeats 15 --out $OUT/steps-7b-0.5b.json > /dev/null
timeout 100 python3 $R/bench/attention_sweep.py --out $OUT/attention-sweep.json > $OUT/attention-sweep.txt 2>&1
ls -la $OUT
