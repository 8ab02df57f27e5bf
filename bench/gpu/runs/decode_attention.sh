#!/usr/bin/env bash
# On the GPU machine, no models needed: the CUDA decode attention (kernels/cuda/decode_attention.cu)
# in the fused draft's one-token steps. Its tests and the fused draft's, the kernel against
# Triton's (bench/gpu/kernels/decode_attention.py), then `bass bench steps` with random weights at
# the real shapes, the int8 draft as served, fused layers attending through Triton and through the
# CUDA kernel, alternated, at BATCHES (default 1,8).
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh > /dev/null
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider $R/tests/test_cuda_attention.py \
  $R/tests/test_cuda_library.py $R/tests/test_fused_layers.py $R/tests/test_draft_loop.py 2>&1 | tail -15 \
  > $OUT/decode-attention-tests.txt
cat $OUT/decode-attention-tests.txt
timeout ${KERNEL_TIMEOUT:-120} python3 $R/bench/gpu/kernels/decode_attention.py $OUT/decode-attention-kernel.json \
  2>&1 | tail -20
timeout ${STEPS_TIMEOUT:-300} python3 -m bass.cli bench steps --batches ${BATCHES:-1,8} --draft-lengths 3 \
  --repeats ${REPEATS:-50} --draft-int8 \
  --configs ${CONFIGS:-triton-cuda-triton-attention:graphs,triton-cuda:graphs,triton-cuda-triton-attention:graphs,triton-cuda:graphs} \
  --out $OUT/steps-decode-attention.json 2> $OUT/steps-decode-attention.log > /dev/null
python3 - $OUT/steps-decode-attention.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{r['attention']:30s} batch {r['batch']:3d}: draft forward {r['draft_forward_q1_ms']:.3f} ms, "
          f"target forward {r['target_forward_q1_ms']:.3f} ms")
PY
