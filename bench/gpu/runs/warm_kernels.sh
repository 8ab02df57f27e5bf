#!/usr/bin/env bash
# On the GPU machine, after setup.sh: one short, untimed `bass bench speed --services` process over
# every fixed draft length and `auto` at 1-8 sequences, so that Triton's disk cache holds the kernel
# variants the timed processes will use. On a fresh machine the first process otherwise compiles
# them inside its timed rounds: 0.1-0.3 s a verification at each length first used (H100,
# 2026-11-27, bench/results/journal/2026-11-27-h100-target-fused.md), the "first process of a call
# runs slow" of earlier entries. Usage: warm_kernels.sh MODE [SITE] (SITE: PYTHONPATH, default /tmp/site).
# WARM_LIMIT_S (default 300): on a fresh two-H200 machine 110 s and 150 s were both too few
# (bench/results/journal/2026-11-28-h200x2-lookup-tails.md); what it leaves uncompiled, the first
# timed process compiles.
set -uo pipefail
mode=$1 site=${2:-/tmp/site}
cd /tmp
PYTHONPATH=$site timeout ${WARM_LIMIT_S:-300} python3 -m bass.cli bench speed --target /tmp/models/qwen2.5-coder-1.5b-instruct \
  --draft /tmp/models/qwen2.5-coder-0.5b-instruct --device cuda --dtype bfloat16 --max-seq-len 1024 \
  --max-new-tokens 24 --problems 0:16 --batches 1,2,4,8 --policies 0,1,2,3,4,5,6,7,8,auto --repeats 1 \
  --mode $mode --services --out /tmp/warm-kernels.json > /dev/null 2> /tmp/warm-kernels.log
rc=$?
if [ $rc = 124 ]; then  # WARM_LIMIT_S ran out: the rows it reached are compiled
  echo "warm_kernels.sh: stopped at its ${WARM_LIMIT_S:-300} s limit after $(grep -c 'ms/token/seq' /tmp/warm-kernels.log) rows; timing goes on" >&2
elif [ $rc != 0 ]; then
  echo "warm_kernels.sh: the warm-up process failed (exit $rc, see /tmp/warm-kernels.log); timing goes on" >&2
fi
