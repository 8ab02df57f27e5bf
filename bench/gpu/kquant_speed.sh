#!/usr/bin/env bash
# On the GPU machine, after setup.sh (whose conversion writes gguf_blocks/): issue #12's end-to-end
# check of the target reading its k-quant blocks. colocated.sh's in-process `bass bench speed`
# without and with --target-kquant, then again in the other order (a process each, so the order's
# effect shows), for one mode. Usage:
#   kquant_speed.sh MODE BATCHES POLICIES   (e.g. greedy 1,8,64 0,auto)
# LIMIT_S bounds each run; extra arguments go to every run. Files: speed-MODE-kquant-N-VARIANT-inproc.*
set -uo pipefail
mode=$1 batches=$2 policies=$3; shift 3
run=0
for variant in bf16 kquant kquant bf16; do
  run=$((run + 1))
  flag=$([ $variant = kquant ] && echo --target-kquant)
  WAYS=inproc TAG=-kquant-$run-$variant bash bench/gpu/colocated.sh $mode $batches $policies $flag "$@"
done
