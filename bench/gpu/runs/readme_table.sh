#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the README's speed table at the current build, one sampling
# mode a call: `bass bench speed --services` (bass serve's default deployment: the coordinator in
# its own process, the draft in the target's) on the real pair, regular decoding, k = 3 and
# `auto`, at 1 / 8 / 64 sequences, 5 repeats (medians). Usage: readme_table.sh MODE [bench speed
# args...], MODE greedy or t0.8-p0.95. Runs on the GPU CUDA_VISIBLE_DEVICES leaves first. Run the
# two modes one after the other, not side by side on two GPUs of one host: at 64 sequences the
# step is host-bound and two runs slow each other (regular decoding 2.98 ms a token side by side,
# 2.46 alone: bench/results/2026-11-28-h200x2-speculate-ahead/). JSON and log under $OUT.
# WARM=1 (default): an untimed process fills Triton's cache first (warm_kernels.sh).
set -uo pipefail
mode=$1; shift
R=$PWD
cd /tmp  # so that the installed package, not the repo's bass/ folder, is imported
export PYTHONPATH=${PYTHONPATH:-/tmp/site} PYTHONUNBUFFERED=1
[ "${WARM:-1}" = 1 ] && bash $R/bench/gpu/runs/warm_kernels.sh $mode $PYTHONPATH
timeout ${LIMIT_S:-420} python3 -m bass.cli bench speed --target /tmp/models/qwen2.5-coder-1.5b-instruct \
  --draft /tmp/models/qwen2.5-coder-0.5b-instruct --device cuda --dtype bfloat16 --max-seq-len 1024 \
  --max-new-tokens 128 --problems 0:16 --peak-tflops 989 --batches ${BATCHES:-1,8,64} \
  --policies ${POLICIES:-0,3,auto} --repeats ${REPEATS:-5} --mode $mode --services "$@" \
  --out $OUT/readme-$mode.json > /dev/null 2> $OUT/readme-$mode.log
python3 - $OUT/readme-$mode.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    b = r["step_stats"]["breakdown_ms_per_step"]
    print(f"{r['mode']} batch {r['batch']} policy {r['policy']}: {r['ms_per_token_per_sequence']:.3f} ms/token/seq "
          f"(mean of rounds {r.get('ms_per_token_per_sequence_mean', float('nan')):.3f}), "
          f"{r['tokens_per_sequence_step']:.2f} tokens a sequence-step, step {b['step_ms']:.2f} ms")
PY
