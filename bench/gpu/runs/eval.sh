#!/usr/bin/env bash
# On the GPU machine, after setup.sh: `bass serve` on the real pair, then HumanEval within time
# budgets through it (issue #7). Usage: eval.sh NAME N TEMPERATURE BUDGETS [MODES]
#   eval.sh t08-n8 8 0.8 300,600,1200      eval.sh greedy-n1 1 0 300,600
# PROBLEMS=0:82 (default all) runs a part, so that a long run fits one device call;
# DRAFT_LENGTH=auto (default 4) serves with another draft-length policy.
set -uo pipefail
name=$1 n=$2 temperature=$3 budgets=$4 modes=${5:-speculative,regular}
source "$(dirname "$0")/serve.sh"
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
start_serve $OUT/serve-$name.log --draft-length "${DRAFT_LENGTH:-4}" || exit 1
python3 -m bass.cli eval humaneval --address 127.0.0.1:50051 --n $n --temperature $temperature --top-p 0.95 \
  --time-budget-ms $budgets --modes $modes --problems "${PROBLEMS:-all}" --sandbox-workers 8 --out $OUT/eval-$name \
  2> $OUT/eval-$name.log
kill -INT $serve; wait $serve
