#!/usr/bin/env bash
# On the GPU machine, no models needed: what the batch-invariant mode costs and whether it holds.
# tile_bits.py (do tilings change a row's bits?), `bass bench steps` with the target in its default and
# its batch-invariant mode (random weights, CUDA graphs), the invariant GEMMs against cuBLAS, the attention
# plans a layer at a time, and the GPU tests of the mode. Usage: bash bench/gpu/runs/invariant_tax.sh
set -uo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 $R/bench/gpu/kernels/tile_bits.py --out $OUT/tile-bits.json 2>&1 | grep -v Warn | cut -c1-400
timeout 150 python3 -m bass.cli bench steps --configs triton:graphs,triton-invariant:graphs --batches 1,8,64 --draft-lengths 3 --repeats 30 --out $OUT/steps-invariant.json 2>&1 | grep -v Warn | tail -8
timeout 120 python3 $R/bench/gpu/kernels/gemm_invariant.py --only 0,1 --out $OUT/gemm-invariant.json 2>&1 | tail -5
cd $R && timeout 90 python3 bench/gpu/kernels/attention_layers.py --models 1.5b --spreads equal --variants default,inv-1pass,invariant --out $OUT/attention-invariant.json 2>&1 | grep -v Warn
cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider $R/tests/test_batch_invariant.py $R/tests/test_triton_attention.py $R/tests/test_gpu.py 2>&1 | tee $OUT/gpu-tests.log | tail -6
