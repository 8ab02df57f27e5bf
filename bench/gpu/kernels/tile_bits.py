#!/usr/bin/env python3
"""Whether the row block (and so the tensor-core instruction Triton picks: mma.sync below 64
rows, wgmma from 64) changes a row's bits, at a fixed split of the reduction: the question that
decides whether a batch-invariant kernel may pick its row block by the number of rows.

For the 1.5B's weight shapes (kernels/triton_matmul.launch_linear) and its attention
(kernels/triton_attention, fixed key splits), compares outputs of the same rows computed under
tilings that differ only in BLOCK_M / BLOCK_N / BLOCK_K, and prints whether they are bitwise
equal. Usage: python bench/gpu/kernels/tile_bits.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from bass.kernels.batch import RaggedBatch, SequenceChunk
from bass.kernels.triton_attention import attend_triton
from bass.kernels.triton_matmul import launch_linear

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
BLOCKS = [(16, 32, 128, 4, 4), (16, 64, 64, 4, 4), (32, 64, 64, 4, 4), (64, 32, 64, 4, 4), (64, 128, 64, 4, 3),
          (128, 64, 64, 8, 3)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    arrivals = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    report = {"device": torch.cuda.get_device_name(), "gemm": {}, "attention": {}}
    for name, (cols, inner) in SHAPES.items():
        w = (torch.randn(cols, inner, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        x = torch.randn(320, inner, device="cuda", generator=gen).to(torch.bfloat16)
        for splits in (1, 4):
            outs = {}
            for block in BLOCKS:
                for rows in (8, 320):
                    out = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
                    launch_linear(x[:rows].contiguous(), w, None, out, arrivals, block, splits)
                    outs[(block, rows)] = out[:8]
            ref = outs[(BLOCKS[0], 8)]
            same = {f"{b} rows {r}": bool(torch.equal(o, ref)) for (b, r), o in outs.items()}
            report["gemm"][f"{name} splits {splits}"] = same
            print(name, "splits", splits, "equal to", BLOCKS[0], "at 8 rows:",
                  {k: v for k, v in same.items()}, flush=True)
    heads, kv_heads, dim = 12, 2, 128
    k = torch.randn(8, 2048, kv_heads, dim, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(8, 2048, kv_heads, dim, device="cuda", generator=gen).to(torch.bfloat16)
    for q_len in (1, 4):
        chunks = [SequenceChunk(slot=b, start=300 + 97 * b, tokens=[0] * q_len, logit_rows=0) for b in range(8)]
        batch = RaggedBatch.build(chunks, "cuda")
        q = torch.randn(batch.num_tokens, heads, dim, device="cuda", generator=gen).to(torch.bfloat16)
        outs = {bm: attend_triton(q, k, v, batch, dim ** -0.5, block_m=bm, split_keys=128, mask_every_tile=True)
                for bm in (16, 32, 64)}
        same = {f"block_m {bm}": bool(torch.equal(o, outs[16])) for bm, o in outs.items()}
        report["attention"][f"q_len {q_len}"] = same
        print("attention q_len", q_len, "equal to block_m 16:", same, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
