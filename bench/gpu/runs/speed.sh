#!/usr/bin/env bash
# On the GPU machine, after setup.sh: GPU tests, then end-to-end speed with the real pair (issue #5)
# in our engine: regular vs speculative over a batch sweep, greedy and T = 0.8, in-process and
# through the gRPC services. JSON under $OUT. (HF baselines: hf.sh.)
set -uo pipefail
R=$PWD
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
common=(--target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128)
speed=(python3 -m bass.cli bench speed "${common[@]}" --problems 0:16 --peak-tflops 989)
# The GPU tests and the Triton kernels against their references in bf16/fp16 (CPU CI runs them in
# Triton's interpreter, in fp32 only).
timeout 240 python3 -m pytest -q -p no:cacheprovider $R/tests/test_gpu.py $R/tests/test_triton_elementwise.py \
  $R/tests/test_triton_attention.py 2>&1 | tail -15 > $OUT/gpu-tests.txt
timeout 200 "${speed[@]}" --batches 1,2,4,8,16,32,64 --policies 0,auto,4 --out $OUT/speed-greedy.json \
  > /dev/null 2> $OUT/speed.log
timeout 80 "${speed[@]}" --batches 1,8,64 --policies 0,auto,4 --mode t0.8-p0.95 --out $OUT/speed-t08.json \
  > /dev/null 2>> $OUT/speed.log
timeout 80 "${speed[@]}" --batches 1,8 --policies 0,auto,4 --services --out $OUT/speed-services.json \
  > /dev/null 2>> $OUT/speed.log
tail -40 $OUT/speed.log
ls -la $OUT
