#!/usr/bin/env bash
# On the GPU machine, after setup.sh: issue #15's runs (GPU tests: worker_calls.sh). The exact
# acceptance of the standard rule and of the Gumbel coupling on HumanEval x 8 at T = 0.8 and
# 0.2; batch invariance (seeded requests alone vs batched, regular vs speculative); seeded
# requests through `bass serve` alone and under concurrent load. JSON under $OUT.
set -uo pipefail
R=$PWD
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=${SITE:-/tmp/site} PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
common=(--target $T --draft $D --device cuda --dtype bfloat16 --max-seq-len 1024)
timeout 300 python3 -m bass.cli bench acceptance-rules "${common[@]}" --problems ${RULES_PROBLEMS:-all} -n 8 \
  --max-new-tokens 128 --batch-prompts 8 --draft-vocabs 0,16384,32768,65536 --out $OUT/acceptance-rules.json \
  > /dev/null 2> $OUT/rules.log
timeout 200 python3 -m bass.cli bench invariance "${common[@]}" --problems 0:32 --max-new-tokens 128 \
  --policies 0,4,auto --out $OUT/invariance.json > /dev/null 2> $OUT/invariance.log
source $R/bench/gpu/runs/serve.sh
if start_serve $OUT/serve.log; then
  timeout 200 python3 $R/bench/gpu/runs/seeded_load.py --address 127.0.0.1:50051 --requests 24 --rounds 4 \
    --concurrency 24 --out $OUT/seeded-load.json > $OUT/seeded-load.txt 2>&1
  kill $serve; wait $serve
fi
tail -3 $OUT/rules.log; cat $OUT/invariance.log $OUT/seeded-load.txt
python3 -c "import json; [print(r['mode'], r['alpha_standard'], r['alpha_gumbel'], r['tokens_per_step']['4'], {n: (v['alpha_standard'], v['alpha_gumbel']) for n, v in r.get('draft_vocab', {}).items()}) for r in json.load(open('$OUT/acceptance-rules.json'))['results']]"
