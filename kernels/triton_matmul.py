"""A linear layer whose every output row is computed the same way whatever the batch around it.

cuBLAS picks its kernel by the shape of the product: split-K for a few rows, other tilings for
more, so row r of x @ w.T can differ in the last bits between a batch of 1 and of 64. In bf16
that is enough to flip a near-tied token (bench/results, 2026-11-23 evening: 5-12 of 32 seeded
sequences changed between alone and batched on an H100). Here each output element is the
same fp32 chain of sums over K whatever the number of rows: the K range is split (or not) by the
weight's shape alone and the splits are summed in order; the tiling, which does not change a
row's bits (see below), is picked by rows. So a row's result depends on that row and the
weights alone. Used by the batch-invariant mode (RunnerConfig.batch_invariant);
reference: F.linear.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_splitk import reduce_split_k, split_k_scratch  # noqa: E402

# What may depend on the number of rows and what may not. On an H100-class GPU a row's bits do
# not change with the tiling (BLOCK_M 16-128, so mma.sync or wgmma; BLOCK_N; BLOCK_K 64 or 128;
# warps; stages): each output element is the same chain of fp32 accumulations over K in steps of
# 16 (bench/gpu/kernels/tile_bits.py, H200, 2026-11-27: bitwise equal at 8 and 320 rows, every
# shape of the 1.5B). What changes them is where the K range is split: so the split (its count
# and its boundaries, multiples of _K_GRANULE) is a function of the weight's shape alone, and
# the tiling is picked by rows, as cuBLAS does, from bench/gpu/kernels/gemm_invariant.py (H200,
# 2026-11-27, 1.5B shapes; cuBLAS, not invariant, beside). down (K = 8960) splits its K range 4
# ways: 9.6 / 13.1 / 30.2 / 174 µs at 8 / 40 / 320 / 2048 rows against 7.9 / 9.1 / 17.1 / 73.5
# (one pass: 21.3 at 8 rows); the others keep one pass (a split costs them more at 320 rows than
# it saves at 8).
Tiling = tuple[int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
_K_GRANULE = 128  # split boundaries are multiples of this (so of every BLOCK_K)
_SPLIT_INNER_FROM, _INNER_SPLITS = 4096, 4
_WIDE_FROM_COLS = 16384  # gate|up and the LM head
_HUGE_COLS = 65536  # the LM head
_VERIFY_ROWS = 128
_FEW_ROWS = 16
_PREFILL_ROWS = 1024
_ARRIVAL_COUNTERS = 1 << 16


def splits_for(inner: int) -> int:
    """K splits of a weight with this inner size: fixed for the shape, never for the rows."""
    return _INNER_SPLITS if inner >= _SPLIT_INNER_FROM else 1


def tiling_for(rows: int, cols: int, inner: int) -> Tiling:
    if rows <= _FEW_ROWS:
        return (16, 64, 64, 4, 4) if cols >= _WIDE_FROM_COLS else (16, 32, 128, 4, 4)
    if splits_for(inner) > 1:
        return (64, 64, 64, 4, 3)
    if _WIDE_FROM_COLS <= cols < _HUGE_COLS and rows <= _VERIFY_ROWS:
        return (64, 64, 64, 4, 4)  # gate|up at 17-128 rows: 18.0 µs at 40 against 21.6 in 64 x 128
    if cols >= _WIDE_FROM_COLS or rows >= _PREFILL_ROWS:
        return (64, 128, 64, 4, 3)
    return (64, 32, 64, 4, 4)


@triton.jit(do_not_specialize=["rows"])
def _linear_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, arrivals_ptr, rows, cols, x_stride, w_stride,
                   out_stride, INNER: tl.constexpr, K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    for k in range(0, K_PER_SPLIT, BLOCK_K):  # constants of the layer's shape: one compile per shape
        kk = k_lo + k + rk
        a = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :],
                    mask=(rm[:, None] < rows) & (kk[None, :] < INNER), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * w_stride + kk[:, None],
                    mask=(rn[None, :] < cols) & (kk[:, None] < INNER), other=0.0)
        acc = tl.dot(a, b, acc)  # chained into the accumulator, as every tiling's MMAs are
    ok = (rm[:, None] < rows) & (rn[None, :] < cols)
    if K_PER_SPLIT < INNER:
        # part: [splits, row blocks * BLOCK_M, cols]; one counter per (row block, column block)
        last, acc = reduce_split_k(acc, part_ptr, arrivals_ptr, rm[:, None] * cols + rn[None, :], ok, pid_k,
                                   tl.num_programs(2), tl.num_programs(0) * BLOCK_M * cols,
                                   pid_m * tl.num_programs(1) + pid_n, BLOCK_M, BLOCK_N)
    else:
        last = True
    if last:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < cols, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None] * out_stride + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=ok)


def launch_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  arrivals: torch.Tensor, tiling: Tiling, splits: int) -> None:
    """One product into `out` (x2 [rows, K] and weight [N, K] row-major) under the given tiling,
    its K range cut into `splits` runs of whole _K_GRANULE steps: the layer's launch, and the
    benchmarks' for candidate tilings."""
    rows, inner = x2.shape
    cols = weight.shape[0]
    block_m, block_n, block_k, warps, stages = tiling
    if _K_GRANULE % block_k:
        raise ValueError(f"BLOCK_K {block_k} does not divide the split granule {_K_GRANULE}")
    k_per = triton.cdiv(triton.cdiv(inner, splits), _K_GRANULE) * _K_GRANULE
    splits = triton.cdiv(inner, k_per)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n), splits)
    part = out
    if splits > 1:
        part, arrivals = split_k_scratch(splits, grid[0] * block_m, cols, grid[0] * grid[1], arrivals, x2.device)
    _linear_kernel[grid](x2, weight, bias if bias is not None else weight, out, part, arrivals, rows, cols,
                         x2.stride(0), weight.stride(0), out.stride(0), INNER=inner, K_PER_SPLIT=k_per,
                         HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                         num_warps=warps, num_stages=stages)


class InvariantLinear:
    """x @ weight.T (+ bias) with F.linear's signature: x [..., K], weight [N, K], bias [N]; the
    result in x's dtype, fp32 accumulation. Holds the split-K arrival counters (left zeroed by
    the kernel) of the model it serves."""

    def __init__(self, device: torch.device | str):
        self.arrivals = torch.zeros(_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
        if triton_attention._INTERPRETED:  # tensor loop bounds under NumPy >= 2.4 (see there)
            triton_attention._patch_interpreter_index()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        weight = weight if weight.stride(-1) == 1 else weight.contiguous()
        rows, inner = x2.shape
        cols = weight.shape[0]
        out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
        if rows:
            launch_linear(x2, weight, bias, out, self.arrivals, tiling_for(rows, cols, inner), splits_for(inner))
        return out.reshape(*shape[:-1], cols)
