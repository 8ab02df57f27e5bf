#!/usr/bin/env bash
# On the GPU machine, after setup.sh: issue #15's batch-invariant target on the real pair (bf16).
# Its tests, `bass bench invariance --batch-invariant` (seeded requests alone vs batched,
# regular vs speculative; expect 0 of 32 differing), seeded requests through
# `bass serve --batch-invariant` alone and under concurrent load (expect 0 mismatches), and what
# the mode costs: `bass bench speed`, default target vs invariant target, back to back.
# Everything lands in $OUT/invariant.tgz (a call returns at most 8 files); summaries are printed.
set -uo pipefail
R=$PWD
W=/tmp/invariant-out && rm -rf $W && mkdir -p $W
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
common=(--target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024)
timeout 150 python3 -m pytest -q -p no:cacheprovider $R/tests/test_batch_invariant.py $R/tests/test_sampling.py \
  $R/tests/test_triton_attention.py $R/tests/test_gpu.py -k "invariant or windowed or cut" > $W/tests.txt 2>&1
tail -3 $W/tests.txt
timeout ${INVARIANCE_TIMEOUT:-240} python3 -m bass.cli bench invariance "${common[@]}" --problems 0:32 \
  --max-new-tokens 128 --policies 0,4,auto --batch-invariant --out $W/invariance-bi.json > /dev/null 2> $W/invariance-bi.log
tail -12 $W/invariance-bi.log
source $R/bench/gpu/runs/serve.sh
if start_serve $W/serve-bi.log --batch-invariant; then
  timeout 200 python3 $R/bench/gpu/runs/seeded_load.py --address 127.0.0.1:50051 --requests 24 --rounds 4 \
    --concurrency 24 --out $W/seeded-load-bi.json > $W/seeded-load-bi.txt 2>&1
  kill $serve; wait $serve
fi
tail -8 $W/seeded-load-bi.txt
if [ "${SPEED:-1}" = 1 ]; then
  for flag in "" --batch-invariant; do
    name=speed-greedy${flag:+-bi}
    timeout 150 python3 -m bass.cli bench speed "${common[@]}" --max-new-tokens 128 --problems 0:16 --batches 8,64 \
      --policies 0,auto --mode greedy --repeats 2 $flag --out $W/$name.json > /dev/null 2> $W/$name.log
    python3 -c "import json; [print('$name', r['batch'], r['policy'], r['ms_per_token_per_sequence']) for r in json.load(open('$W/$name.json'))['results']]"
  done
fi
tar czf $OUT/invariant.tgz -C $W .
