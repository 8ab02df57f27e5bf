"""Few-row linear layers with their neighbours fused in (Triton): an experiment for the draft.

Not part of the product: measured on an H100 (bench/results, "2026-11-25 (fused draft kernels;
auto over batches 1-64)"), these kernels were no faster than cuBLAS plus the separate norm and SiLU kernels
they replace, and a whole draft forward ran slower with them (9441552 wired them in; reverted).
Kept with bench/gpu/skinny_gemm.py so that the measurement can be rerun and the idea built on.

A decode forward of the 0.5B draft is bound by how many kernels it launches, not by bytes: at
8 rows its 96 weight GEMMs move ~0.2 ms of weights but cuBLAS takes ~0.6 ms for them, and the
RMSNorms and SiLU * up between them are 72 more launches. Here one launch does what three did:

- `norm_linear`: the residual add and RMSNorm that precede a projection run in the GEMM's
  prologue. With few rows every program can afford to read whole rows: it first sums the
  squares of (x + residual) over the row, then normalises each K block on the fly as it feeds
  the product. The first column block also writes x + residual, the residual stream.
- `silu=True`: the gate|up projection's epilogue applies SiLU(gate) * up, so one program owns
  gate column j and up column j and the [rows, 2 * intermediate] product never reaches memory.

Every intermediate is rounded to the model dtype where the PyTorch references round
(bass/kernels/elementwise.py), but the products sum in another order than cuBLAS's, so the
outputs differ from F.linear in the last bits: fit for a draft only, whose proposals
verification checks. Without split-K, a weight with a long inner size (down: 4,864) gets too few
programs; that is where these lost most.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

MAX_SKINNY_ROWS = 32


class Tiling(NamedTuple):
    block_n: int
    block_k: int
    warps: int
    stages: int


DEFAULT_TILING = Tiling(block_n=32, block_k=128, warps=4, stages=3)
# By (output columns, inner size, silu, row block), filled by skinny_gemm.py's sweep; other
# shapes take DEFAULT_TILING.
TILINGS: dict[tuple[int, int, bool, int], Tiling] = {}


def block_m(rows: int) -> int:
    return 16 if rows <= 16 else 32


def tiling_for(cols: int, inner: int, silu: bool, rows: int) -> Tiling:
    return TILINGS.get((cols, inner, silu, block_m(rows)), DEFAULT_TILING)


@triton.jit(do_not_specialize=["rows", "eps"])
def _skinny_kernel(x_ptr, res_ptr, norm_ptr, sum_ptr, w_ptr, bias_ptr, out_ptr, rows, cols, eps,
                   INNER: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    dtype = out_ptr.dtype.element_ty
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm[:, None] < rows
    col_ok = rn[None, :] < cols
    if NORM:
        # Pass 1: each row's inverse RMS of (x + residual), the sum rounded to dtype first as the
        # reference does. The rows are few, so reading them twice costs less than a launch.
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k in range(0, INNER, BLOCK_K):
            kk = k + rk
            mask = row_ok & (kk[None, :] < INNER)
            a = tl.load(x_ptr + rm[:, None] * INNER + kk[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:
                r = tl.load(res_ptr + rm[:, None] * INNER + kk[None, :], mask=mask, other=0.0).to(tl.float32)
                a = (a + r).to(dtype).to(tl.float32)
            squares += tl.sum(a * a, axis=1)
        inv = tl.rsqrt(squares / INNER + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SILU:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, INNER, BLOCK_K):
        kk = k + rk
        mask = row_ok & (kk[None, :] < INNER)
        a = tl.load(x_ptr + rm[:, None] * INNER + kk[None, :], mask=mask, other=0.0)
        if NORM:
            af = a.to(tl.float32)
            if HAS_RES:
                r = tl.load(res_ptr + rm[:, None] * INNER + kk[None, :], mask=mask, other=0.0).to(tl.float32)
                summed = (af + r).to(dtype)
                if pid_n == 0:
                    tl.store(sum_ptr + rm[:, None] * INNER + kk[None, :], summed, mask=mask)
                af = summed.to(tl.float32)
            g = tl.load(norm_ptr + kk, mask=kk < INNER, other=0.0).to(tl.float32)
            a = (g[None, :] * (af * inv[:, None]).to(dtype).to(tl.float32)).to(dtype)
        w_mask = col_ok & (kk[:, None] < INNER)
        b = tl.load(w_ptr + rn[None, :] * INNER + kk[:, None], mask=w_mask, other=0.0)
        acc += tl.dot(a, b)
        if SILU:
            b_up = tl.load(w_ptr + (rn[None, :] + cols) * INNER + kk[:, None], mask=w_mask, other=0.0)
            acc_up += tl.dot(a, b_up)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < cols, other=0.0).to(tl.float32)[None, :]
    if SILU:
        gate = acc.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = act * acc_up.to(dtype).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * cols + rn[None, :], acc.to(dtype), mask=row_ok & col_ok)


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None, eps: float,
                weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu: bool = False,
                tiling: Tiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, summed): summed = x + residual (x when residual is None), h = rms_norm(summed) *
    norm_weight (h = x when norm_weight is None), out = h @ weight.T + bias; with silu, weight is
    gate|up [2 * N, K] and out = silu(h @ gate.T) * (h @ up.T) [rows, N]. x, residual: [rows, K]
    contiguous, rows <= MAX_SKINNY_ROWS."""
    x = x.contiguous()
    residual = residual.contiguous() if residual is not None else None
    rows, inner = x.shape
    if rows > MAX_SKINNY_ROWS:
        raise ValueError(f"norm_linear serves at most {MAX_SKINNY_ROWS} rows, got {rows}")
    cols = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    has_res = residual is not None
    summed = torch.empty_like(x) if has_res else x
    if rows:
        t = tiling or tiling_for(cols, inner, silu, rows)
        bm = block_m(rows)
        grid = (triton.cdiv(cols, t.block_n), triton.cdiv(rows, bm))
        _skinny_kernel[grid](x, residual if has_res else x, norm_weight if norm_weight is not None else x, summed,
                             weight, bias if bias is not None else weight, out, rows, cols, eps,
                             INNER=inner, NORM=norm_weight is not None, HAS_RES=has_res, HAS_BIAS=bias is not None,
                             SILU=silu, BLOCK_M=bm, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                             num_warps=t.warps, num_stages=t.stages)
    return out, summed


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  tiling: Tiling | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) for few rows, F.linear's signature."""
    return norm_linear(x, None, None, 0.0, weight, bias, tiling=tiling)[0]
