#!/usr/bin/env bash
# On the GPU machine, no models needed: the fused draft layers (engine/fused_layers.py). The CUDA
# kernel's tests (fused epilogues included) and the fused-draft decode test, then `bass bench
# steps` with random weights at the real shapes, the int8 draft as served: today's Triton path,
# the CUDA products unfused, and fused (CONFIGS overrides), at BATCHES (default 1,8).
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh > /dev/null
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider $R/tests/test_cuda_skinny.py \
  $R/tests/test_triton_elementwise.py $R/tests/test_fused_layers.py 2>&1 | tail -15 > $OUT/fused-tests.txt
cat $OUT/fused-tests.txt
timeout ${STEPS_TIMEOUT:-300} python3 -m bass.cli bench steps --batches ${BATCHES:-1,8} --draft-lengths 3 \
  --repeats ${REPEATS:-50} --draft-int8 \
  --configs ${CONFIGS:-triton:graphs,triton-cuda-unfused:graphs,triton-cuda:graphs,triton-cuda-unfused:graphs,triton-cuda:graphs} \
  --out $OUT/steps-fused.json 2> $OUT/steps-fused.log > /dev/null
python3 - $OUT/steps-fused.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{r['attention']:22s} batch {r['batch']:3d}: draft forward {r['draft_forward_q1_ms']:.3f} ms, "
          f"target forward {r['target_forward_q1_ms']:.3f} ms, verify k=3 {r['verify_ms']['3']:.3f} ms")
PY
