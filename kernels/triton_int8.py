"""Few-row products with weight-only int8 weights (Triton): the draft's projections and LM head.

A decode forward of the 0.5B draft at 1-16 rows spends most of its time in weight GEMMs that
move bytes slowly: on an H200 (the retired bench/gpu/weight_only_gemm.py, `git show
fed2b30:bench/gpu/weight_only_gemm.py`; 8 rows, µs per call over 24 layers' weights) cuBLAS
takes 4.3 / 3.6 / 7.2 / 7.9 µs for q|k|v / o / gate|up / down and 70 µs for the 152k-token LM
head, 272 MB in bf16. Weights stored as int8 with one fp32 scale per output column halve the
bytes; this kernel loads an int8 tile, widens it to bf16 (exact: |q| <= 127) for the tensor
cores and scales each column at the end: 3.2 / 3.2 / 6.2 / 5.5 and 40 µs.

Only a draft may run this: its numbers decide which tokens it proposes, and verification keeps
the target's own (lossless for any draft). Rounding per output column costs ~1% relative error
on random weights.

A long inner size (down: 4,864) would leave few programs, so the K range is split over the
grid's second axis, the last split to arrive summing the partials in order
(kernels/triton_splitk.py).

Rows beyond MAX_INT8_ROWS go to cuBLAS on the full-precision weight, which the model keeps for
them (prefill, catch-up and large batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_splitk import reduce_split_k, split_k_scratch  # noqa: E402

MAX_INT8_ROWS = 16  # more rows take cuBLAS on the full weight
_BLOCK_M = 16  # rows per program: the smallest tensor-core block
_ARRIVAL_COUNTERS = 1024
# (BLOCK_N, BLOCK_K, warps, stages, K splits), the best of the retired weight_only_gemm.py grid on
# an H200 at 1 / 8 / 16 rows: narrow column blocks for few columns (more programs), wide ones for
# the LM head, a split K for long inner sizes.
_FEW_COLUMNS, _MANY_COLUMNS, _HUGE_COLUMNS, _LONG_INNER = (16, 128, 4, 4, 1), (32, 128, 4, 4, 1), \
    (64, 128, 4, 4, 1), (32, 128, 4, 4, 8)


def _tiling(cols: int, inner: int) -> tuple[int, int, int, int, int]:
    if inner >= 4096:
        return _LONG_INNER
    if cols >= 65536:
        return _HUGE_COLUMNS
    return _MANY_COLUMNS if cols >= 4096 else _FEW_COLUMNS


@dataclass(frozen=True)
class Int8Weight:
    """A projection's weight [N, K] twice: int8 with a scale per output column (few rows) and
    in the model dtype (many rows)."""

    full: torch.Tensor
    q: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # fp32 [N]

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> "Int8Weight":
        """Symmetric per-output-column int8: q = round(w / s), s = max |w| / 127 over the column's
        inputs."""
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(full=weight, q=q.contiguous(), scale=scale.contiguous())

    def dequantized(self) -> torch.Tensor:
        """The weight the int8 path computes with, fp32 [N, K] (tests, references)."""
        return self.q.float() * self.scale[:, None]


@triton.jit
def _finish(acc, scale_ptr, bias_ptr, out_ptr, rm, rn, rows, cols, HAS_BIAS: tl.constexpr):
    acc = acc * tl.load(scale_ptr + rn, mask=rn < cols, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < cols, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * cols + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < rows) & (rn[None, :] < cols))


@triton.jit(do_not_specialize=["rows"])
def _int8_linear_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, part_ptr, arrivals_ptr, rows, cols, inner,
                        k_per_split, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm[:, None] < rows
    col_ok = rn[None, :] < cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, inner)
    for k in range(k_lo, k_hi, BLOCK_K):
        kk = k + rk
        a = tl.load(x_ptr + rm[:, None] * inner + kk[None, :], mask=row_ok & (kk[None, :] < k_hi), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * inner + kk[:, None], mask=col_ok & (kk[:, None] < k_hi), other=0)
        if UPCAST:  # the interpreter (CPU tests): its bf16 dot is wrong, fp32 is exact here
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc += tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    if SPLIT:
        # part: [splits, row blocks * BLOCK_M, cols]; one counter per (row block, column block)
        last, total = reduce_split_k(acc, part_ptr, arrivals_ptr, rm[:, None] * cols + rn[None, :], row_ok & col_ok,
                                     pid_k, tl.num_programs(1), tl.num_programs(2) * BLOCK_M * cols,
                                     pid_m * tl.num_programs(0) + pid_n, BLOCK_M, BLOCK_N)
        if last:
            _finish(total, scale_ptr, bias_ptr, out_ptr, rm, rn, rows, cols, HAS_BIAS)
    else:
        _finish(acc, scale_ptr, bias_ptr, out_ptr, rm, rn, rows, cols, HAS_BIAS)


class Int8Linear:
    """x @ w.T (+ bias) for Int8Weight w: the int8 kernel up to max_rows rows, cuBLAS on the
    full weight beyond. Holds the split-K arrival counters of the model it serves."""

    def __init__(self, device: torch.device, max_rows: int = MAX_INT8_ROWS):
        self.max_rows = max_rows
        self.arrivals = torch.zeros(_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
        if triton_attention._INTERPRETED:  # tensor loop bounds under NumPy >= 2.4 (see there)
            triton_attention._patch_interpreter_index()

    def __call__(self, x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [rows, K] -> [rows, N] in out_dtype (default x's)."""
        rows, inner = x.shape
        out_dtype = out_dtype or x.dtype
        if rows > self.max_rows or rows == 0:
            return F.linear(x, weight.full, bias).to(out_dtype)
        x = x if x.is_contiguous() else x.contiguous()
        cols = weight.q.shape[0]
        out = torch.empty((rows, cols), dtype=out_dtype, device=x.device)
        block_n, block_k, warps, stages, splits = _tiling(cols, inner)
        k_per = triton.cdiv(triton.cdiv(inner, splits), block_k) * block_k
        splits = triton.cdiv(inner, k_per)
        grid = (triton.cdiv(cols, block_n), splits, triton.cdiv(rows, _BLOCK_M))
        part, arrivals = out, self.arrivals
        if splits > 1:
            part, arrivals = split_k_scratch(splits, grid[2] * _BLOCK_M, cols, grid[0] * grid[2], arrivals, x.device)
        _int8_linear_kernel[grid](x, weight.q, weight.scale, bias if bias is not None else weight.scale, out, part,
                                  arrivals, rows, cols, inner, k_per, HAS_BIAS=bias is not None,
                                  SPLIT=splits > 1, UPCAST=triton_attention._INTERPRETED, BLOCK_M=_BLOCK_M,
                                  BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
        return out
