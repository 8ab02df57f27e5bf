"""The CUDA decode attention (kernels/cuda_attention.py) against the Triton kernel it replaces in
a fused draft's steps: one query token a sequence, the real pair's head shapes, 24 layers' calls
in a CUDA graph (µs a call), and the largest difference between the two outputs.

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kernels/decode_attention.py OUT.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from bass.kernels.batch import RaggedBatch, SequenceChunk
from bass.kernels.cuda_attention import load_decode_attention
from bass.kernels.timing import graph_us
from bass.kernels.triton_attention import attend_triton

SHAPES = {"draft": (14, 2, 64, 24), "target": (12, 2, 128, 28)}  # heads, kv heads, head dim, layers


def main() -> None:
    attention = load_decode_attention(torch.device("cuda"))
    counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
    rows = []
    for name, (heads, kv_heads, dim, layers) in SHAPES.items():
        for batch_size in (1, 8, 32):
            for context in (128, 512, 1500):
                max_len = 2048
                caches = [(torch.randn(batch_size, max_len, kv_heads, dim, device="cuda").bfloat16(),
                           torch.randn(batch_size, max_len, kv_heads, dim, device="cuda").bfloat16())
                          for _ in range(layers)]
                q = torch.randn(batch_size, heads, dim, device="cuda").bfloat16()
                batch = RaggedBatch.build([SequenceChunk(slot=b, start=context - 1, tokens=[1], logit_rows=1)
                                           for b in range(batch_size)], "cuda")
                # as a CUDA graph of the draft loop plans it: contexts bounded by the cache's length
                bounded = replace(batch, max_ctx=max_len, ctx_lens_list=[max_len] * batch_size,
                                  ctx_lens_are_bounds=True)
                scale = dim ** -0.5
                triton_us = graph_us(lambda: [attend_triton(q, k, v, bounded, scale, arrivals=counters)
                                              for k, v in caches], layers)
                cuda_us = graph_us(lambda: [attention(q, k, v, bounded, scale) for k, v in caches], layers)
                diff = (attention(q, *caches[0], batch, scale).float()
                        - attend_triton(q, *caches[0], batch, scale, arrivals=counters).float()).abs().max().item()
                rows.append({"model": name, "batch": batch_size, "context": context, "triton_us": round(triton_us, 2),
                             "cuda_us": round(cuda_us, 2), "max_abs_diff": diff})
                print(f"{name} batch {batch_size} context {context}: Triton {triton_us:.2f} µs, CUDA {cuda_us:.2f} µs,"
                      f" max |diff| {diff:.4f}", flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "results": rows}, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
