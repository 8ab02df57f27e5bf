#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the CUDA few-row products (RunnerConfig.few_row_cuda) end to
# end on the real pair, off then on, in one machine session: `bass bench speed --services` (the
# README's bench: first 16 HumanEval prompts, 128 new tokens), regular decoding and k = 3 (or
# POLICIES), at BATCHES (default 1,8), REPEATS runs each (medians). Usage: few_row_cuda.sh [MODE].
# FLAGS: the settings compared, in order (default "--no-few-row-cuda --few-row-cuda"; "default"
# runs with neither flag: the draft's products on the kernel and its layers fused, the target's not).
set -uo pipefail
mode=${1:-greedy}
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=${PYTHONPATH:-/tmp/site} PYTHONUNBUFFERED=1
for flag in ${FLAGS:---no-few-row-cuda --few-row-cuda}; do
  arg=$flag; [ "$flag" = default ] && arg=
  timeout ${LIMIT_S:-280} python3 -m bass.cli bench speed --target /tmp/models/qwen2.5-coder-1.5b-instruct \
    --draft /tmp/models/qwen2.5-coder-0.5b-instruct --device cuda --dtype bfloat16 --max-seq-len 1024 \
    --max-new-tokens 128 --problems 0:16 --batches ${BATCHES:-1,8} --policies ${POLICIES:-0,3} \
    --repeats ${REPEATS:-3} --mode $mode --services $arg --out $OUT/speed-$mode$flag.json > /dev/null \
    2> $OUT/speed-$mode$flag.log
  python3 - $OUT/speed-$mode$flag.json $flag <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    b = r["step_stats"]["breakdown_ms_per_step"]
    print(f"{sys.argv[2]} {r['mode']} batch {r['batch']} policy {r['policy']}: {r['ms_per_token_per_sequence']:.3f} "
          f"ms/token/seq, {r['tokens_per_sequence_step']:.2f} tokens a sequence-step, step {b['step_ms']:.2f} ms "
          f"{ {k: round(v, 2) for k, v in b.items() if k != 'step_ms'} }")
PY
done
