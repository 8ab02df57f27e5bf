"""A linear layer whose every output row is computed the same way whatever the batch around it.

cuBLAS picks its kernel by the shape of the product: split-K for a few rows, other tilings for
more, so row r of x @ w.T can differ in the last bits between a batch of 1 and of 64. In bf16
that is enough to flip a near-tied token (bench/results, 2026-11-23 evening: 5-12 of 32 seeded
sequences changed between alone and batched on an H100). Here one compiled kernel per weight
shape, with one tiling and one split of the reduction, serves every number of rows: each output
element is the same fp32 sum over K in BLOCK_K steps (and over the splits) in the same order, so
a row's result depends on that row and the weights alone. Used by the batch-invariant mode (RunnerConfig.batch_invariant);
reference: F.linear.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_splitk import reduce_split_k  # noqa: E402

# A weight's tiling (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, K splits) may depend on the
# weight's shape, never on the number of rows: that would bring back the batch dependence this
# kernel removes. A split of the K range is allowed on the same terms: a fixed number of splits
# for the shape, their fp32 partials summed in split order by the last to arrive
# (kernels/triton_splitk.py), so each output element is still one fixed sequence of sums.
# Chosen from bench/gpu/kernels/gemm_invariant.py on an H100 at the 1.5B's shapes, 8 / 40 / 320 rows
# (bench/results/2026-11-23-h100-gemm-invariant-tilings-668887e.json): narrow column blocks for
# weights with few output columns (q|k|v, o, down: more programs), wide ones for many (gate|up,
# the LM head). One forward's GEMMs then take about 1.88 / 1.94 / 3.34 ms at 8 / 40 / 320 rows,
# against 2.22 / 2.26 / 4.02 with 64x64x64 everywhere (cuBLAS, not invariant: 1.34 / 1.45 / 2.66).
# The down projection (K = 8960 in one program per 32 columns: 25 µs against cuBLAS's 9 at 8
# rows) splits its K range.
Tiling = tuple[int, int, int, int, int, int]
_NARROW: Tiling = (64, 32, 64, 4, 4, 1)
_WIDE: Tiling = (64, 128, 64, 4, 3, 1)
_LONG_INNER: Tiling = (64, 32, 64, 4, 4, 4)
_WIDE_FROM_COLS = 16384
_LONG_INNER_FROM = 4096
_ARRIVAL_COUNTERS = 1 << 16


def tiling_for(cols: int, inner: int) -> Tiling:
    if inner >= _LONG_INNER_FROM:
        return _LONG_INNER
    return _WIDE if cols >= _WIDE_FROM_COLS else _NARROW


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
        acc += tl.dot(a, b)
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
                  arrivals: torch.Tensor, tiling: Tiling) -> None:
    """One product into `out` under the given tiling (x2 [rows, K] and weight [N, K] row-major):
    the layer's launch, and the benchmark's for candidate tilings."""
    rows, inner = x2.shape
    cols = weight.shape[0]
    block_m, block_n, block_k, warps, stages, splits = tiling
    k_per = triton.cdiv(triton.cdiv(inner, splits), block_k) * block_k
    splits = triton.cdiv(inner, k_per)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n), splits)
    part = out
    if splits > 1:
        part = torch.empty((splits, grid[0] * block_m, cols), dtype=torch.float32, device=x2.device)
        if grid[0] * grid[1] > arrivals.numel():  # a prefill larger than the counters cover
            arrivals = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x2.device)
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
            launch_linear(x2, weight, bias, out, self.arrivals, tiling_for(cols, inner))
        return out.reshape(*shape[:-1], cols)
