#!/usr/bin/env bash
# On the GPU machine, after setup.sh: `bass serve` on the real pair, then HumanEval within time
# budgets through it (issue #7). Usage: eval.sh NAME N TEMPERATURE BUDGETS [MODES]
#   eval.sh t08-n8 8 0.8 300,600,1200      eval.sh greedy-n1 1 0 300,600
set -uo pipefail
name=$1 n=$2 temperature=$3 budgets=$4 modes=${5:-speculative,regular}
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
M=/tmp/models
python3 -m bass.cli serve --target $M/qwen2.5-coder-1.5b-instruct --draft $M/qwen2.5-coder-0.5b-instruct \
  --device cuda --port 50051 --draft-length 4 > $OUT/serve-$name.log 2>&1 &
serve=$!
for _ in $(seq 120); do
  python3 -m bass.cli client --address 127.0.0.1:50051 --prompt-ids 1,2 --max-new-tokens 1 --timeout 2 \
    > /dev/null 2>&1 && break
  sleep 1
done
python3 -m bass.cli eval humaneval --address 127.0.0.1:50051 --n $n --temperature $temperature --top-p 0.95 \
  --time-budget-ms $budgets --modes $modes --sandbox-workers 8 --out $OUT/eval-$name 2> $OUT/eval-$name.log
kill -INT $serve; wait $serve
