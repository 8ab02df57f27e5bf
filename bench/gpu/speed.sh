#!/usr/bin/env bash
# On the GPU machine, after setup.sh: GPU tests, then end-to-end speed with the real pair (issue #5):
# our engine (regular vs speculative over a batch sweep, greedy and T = 0.8, in-process and
# through the gRPC services), HF transformers (eager, static cache + compile) on the same
# prompts, and draft acceptance on all 164 HumanEval prompts x 8 samples. JSON under $OUT.
set -uo pipefail
R=$PWD
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
common=(--target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128)
speed=(python3 -m bass.cli bench speed "${common[@]}" --problems 0:16 --peak-tflops 989)
timeout 150 python3 -m pytest -q -p no:cacheprovider -x $R/tests/test_gpu.py $R/tests/test_triton_attention.py \
  2>&1 | tail -4 > $OUT/gpu-tests.txt
timeout 200 "${speed[@]}" --batches 1,2,4,8,16,32,64 --policies 0,auto,4 --out $OUT/speed-greedy.json \
  > /dev/null 2> $OUT/speed.log
timeout 80 "${speed[@]}" --batches 1,8,64 --policies 0,auto,4 --mode t0.8-p0.95 --out $OUT/speed-t08.json \
  > /dev/null 2>> $OUT/speed.log
timeout 80 "${speed[@]}" --batches 1,8 --policies 0,auto --services --out $OUT/speed-services.json \
  > /dev/null 2>> $OUT/speed.log
hf=(python3 -m bass.cli bench hf --model $T --problems 0:16 --device cuda --dtype bfloat16)
timeout 60 "${hf[@]}" --batches 1,8 --out $OUT/hf-eager.json > /dev/null 2>> $OUT/speed.log
timeout 150 "${hf[@]}" --batches 8 --static-compile --out $OUT/hf-static.json > /dev/null 2>> $OUT/speed.log
tail -40 $OUT/speed.log
ls -la $OUT
