#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the sampled (T = 0.8, top-p 0.95) and greedy batch-8 speed
# runs of speed.sh alone, for a quick before/after of a change to the sampling path.
set -uo pipefail
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
speed=(python3 -m bass.cli bench speed --target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024
       --max-new-tokens 128 --problems 0:16 --peak-tflops 989)
timeout 150 "${speed[@]}" --batches 1,8,64 --policies 0,auto,4 --mode t0.8-p0.95 --out $OUT/speed-t08.json \
  > /dev/null 2> $OUT/speed.log
timeout 120 "${speed[@]}" --batches 1,8,64 --policies 0,auto,4 --out $OUT/speed-greedy.json > /dev/null 2>> $OUT/speed.log
grep "policy" $OUT/speed.log
