"""Few-row products with 8-bit weights (weight-only int8 / fp8, per-output-column scales) against
cuBLAS in bf16, at the 0.5B draft's shapes: an experiment for the draft (issue #12).

A draft forward of the 0.5B at 1-8 rows spends ~60% of its time in its weight GEMMs, which at
that size move bytes (gate|up 17 MB, down 8.7 MB, the LM head 272 MB) at ~1-2 TB/s. The draft's
numbers only decide which tokens it proposes (verification keeps the target's), so its weights
may be stored in 8 bits: half the bytes. Here a Triton kernel loads 8-bit weight tiles, widens
them to bf16 for the tensor cores and scales each output column at the end; long inner sizes
split the K range over programs that add fp32 partials atomically (the buffer zeroed first: its
memset is timed with the kernel; the bf16 rounding is left to the consumer, e.g. the next
residual add, so it is not). Per projection: LAYERS copies of the weight (so they come from
HBM, as in a forward) called once each in one CUDA graph, µs per call; the best tiling per
(projection, rows, weight type) over a small grid.

On a GPU, no models needed: python bench/gpu/weight_only_gemm.py OUT.json [--quick]
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from graph_timing import graph_us

H, Q, KV, I, VOCAB = 896, 896, 128, 4864, 151936
PROJECTIONS = {"qkv": (Q + 2 * KV, H, 24), "o": (H, Q, 24), "gate_up": (2 * I, H, 24), "down": (H, I, 24),
               "lm_head": (VOCAB, H, 4)}  # (output columns, inner size, copies)


@triton.jit
def _weight_only_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, rows, cols, inner, k_per_split,
                        ATOMIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm[:, None] < rows
    col_ok = rn[None, :] < cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * k_per_split
    for k in range(k_lo, k_lo + k_per_split, BLOCK_K):
        kk = k + rk
        a = tl.load(x_ptr + rm[:, None] * inner + kk[None, :], mask=row_ok & (kk[None, :] < inner), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * inner + kk[:, None], mask=col_ok & (kk[:, None] < inner), other=0.0)
        acc += tl.dot(a, b.to(tl.bfloat16))
    acc *= tl.load(scale_ptr + rn, mask=rn < cols, other=0.0)[None, :]
    if ATOMIC:
        tl.atomic_add(out_ptr + rm[:, None] * cols + rn[None, :], acc, mask=row_ok & col_ok, sem="relaxed")
    else:
        tl.store(out_ptr + rm[:, None] * cols + rn[None, :], acc, mask=row_ok & col_ok)


def quantize(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row (column of the product) symmetric 8-bit weights and their fp32 scales."""
    amax = w.float().abs().amax(dim=1).clamp(min=1e-8)
    if kind == "int8":
        scale = amax / 127
        return (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale
    scale = amax / 448
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def weight_only(x, wq, scale, out, tiling):
    block_n, block_k, warps, stages, split = tiling
    rows, inner = x.shape
    cols = wq.shape[0]
    k_per = triton.cdiv(triton.cdiv(inner, split), block_k) * block_k
    if split > 1:
        out.zero_()
    grid = (triton.cdiv(cols, block_n), triton.cdiv(inner, k_per))
    _weight_only_kernel[grid](x, wq, scale, out, rows, cols, inner, k_per, ATOMIC=split > 1, BLOCK_M=16,
                              BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)


def main() -> None:
    out_path, quick = sys.argv[1], "--quick" in sys.argv
    grid = [t for t in itertools.product((16, 32, 64), (128, 256), (4,), (3, 4), (1, 2, 4, 8))]
    if quick:
        grid = grid[:6]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "results": []}
    t0 = time.time()
    for name, (cols, inner, copies) in PROJECTIONS.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        weights = [(torch.randn(cols, inner, device="cuda", generator=gen) * 0.02).bfloat16() for _ in range(copies)]
        for rows in (1, 8, 16):
            x = torch.randn(rows, inner, device="cuda").bfloat16()
            row = {"projection": name, "rows": rows, "cols": cols, "inner": inner,
                   "cublas_bf16_us": graph_us(lambda: [F.linear(x, w) for w in weights], copies)}
            for kind in ("int8", "fp8"):
                quantized = [quantize(w, kind) for w in weights]
                out = torch.empty(rows, cols, device="cuda", dtype=torch.float32)
                ref = F.linear(x.float(), weights[0].float())
                timed = {}
                for tiling in grid:
                    if triton.cdiv(inner, tiling[4]) < tiling[1]:
                        continue
                    try:
                        weight_only(x, *quantized[0], out, tiling)
                        err = ((out - ref).abs().max() / ref.abs().max()).item()
                        timed[tiling] = (graph_us(lambda: [weight_only(x, wq, s, out, tiling) for wq, s in quantized],
                                                  copies), err)
                    except Exception as exc:  # e.g. shared memory
                        print(name, rows, kind, tiling, type(exc).__name__, str(exc)[:120], file=sys.stderr)
                best = min(timed, key=lambda t: timed[t][0])
                row[f"{kind}_us"], row[f"{kind}_rel_err"] = timed[best][0], timed[best][1]
                row[f"{kind}_best"] = dict(zip(("block_n", "block_k", "warps", "stages", "split_k"), best))
            row["bf16_weight_bytes"] = cols * inner * 2
            report["results"].append(row)
            print(json.dumps(row), f"{time.time() - t0:.0f}s", flush=True)
        del weights
        torch.cuda.empty_cache()
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
