#!/usr/bin/env bash
# On the GPU machine, no models needed: programmatic dependent launch (RunnerConfig.programmatic_launch).
# The tests that compare it bit for bit with serial launches (and the kernels' others), then
# `bass bench steps` with random weights at the real shapes, the int8 draft as served, both models'
# few-row products through the CUDA kernel: on, off ("-serial"), on, off, at BATCHES (default 1,8).
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh > /dev/null
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider $R/tests/test_cuda_skinny.py \
  $R/tests/test_triton_attention.py $R/tests/test_fused_layers.py -k "${TESTS:-programmatic or fused or rotary}" 2>&1 \
  | tail -15 > $OUT/programmatic-tests.txt
cat $OUT/programmatic-tests.txt
C=${CONFIGS:-triton-cuda:graphs,triton-cuda-serial:graphs,triton-cuda:graphs,triton-cuda-serial:graphs}
timeout ${STEPS_TIMEOUT:-300} python3 -m bass.cli bench steps --batches ${BATCHES:-1,8} --draft-lengths 3 \
  --repeats ${REPEATS:-50} --draft-int8 --configs $C --out $OUT/steps-programmatic.json 2> $OUT/steps-programmatic.log > /dev/null
python3 - $OUT/steps-programmatic.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{r['attention']:22s} batch {r['batch']:3d}: draft forward {r['draft_forward_q1_ms']:.3f} ms, "
          f"target forward {r['target_forward_q1_ms']:.3f} ms, verify k=3 {r['verify_ms']['3']:.3f} ms")
PY
