#!/usr/bin/env bash
# On the GPU machine, no models needed (was issue5.sh): step costs with random weights at the real
# shapes (`bass bench steps`: the 1.5B target / 0.5B draft over batches 1-64 and draft lengths 1-8,
# every attention config; the 7B shape as target with Triton attention and CUDA graphs), then the
# attention kernels (attention_sweep.py). Each writes JSON under $OUT as soon as it finishes.
# The GPU tests are gpu_tests.sh's. CONFIGS overrides the 1.5B run's attention configs (e.g.
# triton:graphs alone); SEVEN_B=0 skips the 7B shape.
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 300 python3 -m bass.cli bench steps --batches 1,8,32,64 --draft-lengths 1,2,3,4,6,8 --repeats 20 \
  ${CONFIGS:+--configs $CONFIGS} --out $OUT/steps-1.5b-0.5b.json > /dev/null
if [ "${SEVEN_B:-1}" = 1 ]; then
  timeout 150 python3 -m bass.cli bench steps --target qwen2.5-coder-7b --batches 1,8,64 --draft-lengths 2,4,6,8 \
    --configs triton:graphs --repeats 15 --out $OUT/steps-7b-0.5b.json > /dev/null
fi
timeout 100 python3 $R/bench/gpu/kernels/attention_sweep.py --out $OUT/attention-sweep.json > $OUT/attention-sweep.txt 2>&1
ls -la $OUT
