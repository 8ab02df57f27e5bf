"""A linear layer whose every output row is computed the same way whatever the batch around it.

cuBLAS picks its kernel by the shape of the product: split-K for a few rows, other tilings for
more, so row r of x @ w.T can differ in the last bits between a batch of 1 and of 64. In bf16
that is enough to flip a near-tied token (bench/results, 2026-11-23 evening: 5-12 of 32 seeded
sequences changed between alone and batched on an H100). Here one compiled kernel per weight
shape, with one tiling and no split of the reduction, serves every number of rows: each output
element is the same fp32 sum over K in BLOCK_K steps in the same order, so a row's result
depends on that row and the weights alone. Used by the batch-invariant mode (RunnerConfig.batch_invariant);
reference: F.linear.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# A weight's tiling (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) may depend on the weight's shape,
# never on the number of rows: that would bring back the batch dependence this kernel removes.
# Chosen from bench/gpu/kernels/gemm_invariant.py on an H100 at the 1.5B's shapes, 8 / 40 / 320 rows
# (bench/results/2026-11-23-h100-gemm-invariant-tilings-668887e.json): narrow column blocks for
# weights with few output columns (q|k|v, o, down: more programs), wide ones for many (gate|up,
# the LM head). One forward's GEMMs then take about 1.88 / 1.94 / 3.34 ms at 8 / 40 / 320 rows,
# against 2.22 / 2.26 / 4.02 with 64x64x64 everywhere (cuBLAS, not invariant: 1.34 / 1.45 / 2.66).
_NARROW, _WIDE = (64, 32, 64, 4, 4), (64, 128, 64, 4, 3)
_WIDE_FROM_COLS = 16384


def _tiling(cols: int) -> tuple[int, int, int, int, int]:
    return _WIDE if cols >= _WIDE_FROM_COLS else _NARROW


@triton.jit(do_not_specialize=["rows"])
def _linear_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, rows, cols, x_stride, w_stride, out_stride,
                   INNER: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, INNER, BLOCK_K):  # INNER is a layer's constant: one compile per layer shape
        kk = k + rk
        a = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :],
                    mask=(rm[:, None] < rows) & (kk[None, :] < INNER), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * w_stride + kk[:, None],
                    mask=(rn[None, :] < cols) & (kk[:, None] < INNER), other=0.0)
        acc += tl.dot(a, b)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < cols, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * out_stride + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < rows) & (rn[None, :] < cols))


def linear_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) with F.linear's signature: x [..., K], weight [N, K], bias [N];
    the result in x's dtype, fp32 accumulation."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    rows, inner = x2.shape
    cols = weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows:
        block_m, block_n, block_k, warps, stages = _tiling(cols)
        grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n))
        _linear_kernel[grid](x2, weight, bias if bias is not None else weight, out, rows, cols,
                             x2.stride(0), weight.stride(0), out.stride(0), INNER=inner, HAS_BIAS=bias is not None,
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out.reshape(*shape[:-1], cols)
