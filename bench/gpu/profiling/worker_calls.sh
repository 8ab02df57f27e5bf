#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the GPU tests of the sampling path, then Propose/Verify
# inside the workers (worker_calls.py, random weights at the real shapes) for the baseline build
# (/tmp/site-base, made by setup/base_site.sh from .whlbase/) and the current one, plus the current
# one with a 32k-token draft LM head (FR-Spec style), with a profile of batch 8. JSON under $OUT.
# TESTS=0 skips the tests, VOCAB=0 the 32k-vocabulary run; BATCHES picks the batch sizes.
set -uo pipefail
R=$PWD
source $R/bench/gpu/setup/base_site.sh
cd /tmp
export PYTHONUNBUFFERED=1
if [ "${TESTS:-1}" = 1 ]; then
  PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider $R/tests/test_gpu.py \
    $R/tests/test_triton_sampling.py 2>&1 | tail -5 > $OUT/gpu-tests.txt
fi
calls=(python3 $R/bench/gpu/profiling/worker_calls.py --batches ${BATCHES:-1,8,64} --repeats 15)
BASS_COMMIT=${BASE_COMMIT:-} PYTHONPATH=/tmp/site-base timeout 120 "${calls[@]}" --label base \
  --out $OUT/worker-calls-base.json 2>&1 | grep '^{'
PYTHONPATH=/tmp/site timeout 120 "${calls[@]}" --label new --profile $OUT/worker-calls-profile.txt \
  --out $OUT/worker-calls-new.json 2>&1 | grep '^{'
if [ "${VOCAB:-1}" = 1 ]; then
  PYTHONPATH=/tmp/site timeout 60 "${calls[@]}" --batches 8 --label new-vocab32k --draft-vocab 32768 \
    --out $OUT/worker-calls-vocab32k.json 2>&1 | grep '^{'
fi
cat $OUT/gpu-tests.txt 2>/dev/null
