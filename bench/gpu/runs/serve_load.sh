#!/usr/bin/env bash
# On the GPU machine, after setup.sh: `bass serve` on the real pair (defaults: auto draft length,
# 64 slots), then `bass bench serve` through it (issue #14): HumanEval prompts, 256 new tokens,
# greedy and T = 0.8 top-p 0.95, Poisson arrivals up to past regular decoding's saturation (about
# 50 requests/s at batch 64 if answers run the full 256 tokens) and all at once, speculative and
# regular on the same arrivals. Each distinct request is first sent alone (the references the
# answers under load must equal). Writes $OUT/serve-load-{greedy,t08}/serve.{json,md,png} and
# logs; about 5 minutes on an H100. Without matplotlib there, redraw the PNG here:
#   .venv/bin/python -m bass.app.bench.serve_report serve-load-greedy/serve.json
# Overrides: RATES (requests/s), DURATION (seconds of arrivals per run), PROBLEMS (HumanEval slice),
# SERVE_FLAGS (more `bass serve` flags, e.g. "--max-prefill-tokens-per-step 1000000" for admission
# without a prefill budget), TAG (appended to the output names, to keep such runs apart).
set -uo pipefail
source "$(dirname "$0")/serve.sh"
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
rates=${RATES:-4,8,16,32,64,inf} duration=${DURATION:-6} problems=${PROBLEMS:-0:16}
tag=${TAG:-}
start_serve $OUT/serve-load$tag.log ${SERVE_FLAGS:-} || exit 1
for mode in greedy t08; do
  if [ $mode = greedy ]; then sampling="--temperature 0"; else sampling="--temperature 0.8 --top-p 0.95"; fi
  python3 -m bass.cli bench serve --address 127.0.0.1:50051 --rates $rates --duration $duration \
    --num-requests 256 --problems $problems --max-new-tokens 256 $sampling --compare-regular \
    --slo-ttft-ms 500 --slo-tpot-ms 20 --no-progress --out $OUT/serve-load-$mode$tag 2> $OUT/serve-load-$mode$tag.log
  tail -3 $OUT/serve-load-$mode$tag.log
done
kill -INT $serve; wait $serve
