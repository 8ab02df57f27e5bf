"""Few-row products on the tensor cores from CUDA C++ (kernels/cuda/skinny_gemm.cu), in the kernel
library built on the machine that runs them (kernels/cuda_library.py).

Triton has no way to issue a lane's weight loads for several chunks of the inner dimension before
it multiplies any (its pipeliner keeps a few tiles in flight, in order), and at 1-16 rows that is
what a product costs: DRAM round trips, not bytes. The .cu file says how the kernel avoids them.
Launched on PyTorch's current stream, so CUDA graphs capture it like any other launch. Where the
library cannot be had, `load_skinny_gemm` returns None and callers keep their Triton / cuBLAS path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from bass.kernels.cuda_library import load_for_device

MAX_ROWS = 64  # eight 8-row groups
SHARED_FLOATS = 12 * 1024  # the kernel's partial sums: warps x column groups x row groups x 128 fp32


@dataclass(frozen=True)
class Launch:
    """How one product is cut: 8-row groups (the mma's 8-wide side), 16-column groups per warp,
    warps per block, and a persistent grid or not."""

    row_groups: int  # 1, 2, 4 or 8: rows <= 8 * row_groups
    column_groups: int  # 1 or 2
    warps: int  # 2, 4, 8 or 16, splitting the inner dimension
    blocks_per_sm: int = 0  # 0: a block per column tile; else a persistent grid of this many a multiprocessor
    k_splits: int = 1  # blocks a column tile's inner dimension is split over (needs a SplitScratch)

    def fits(self) -> bool:
        return self.warps * self.column_groups * self.row_groups * 128 <= SHARED_FLOATS

    def tiles(self, cols: int) -> int:
        return -(-cols // (16 * self.column_groups))

    def split_floats(self, cols: int) -> int:
        """fp32 partial sums a split launch keeps in its SplitScratch (a tile's entries, then its
        rows' sums of squares for a normed product)."""
        return self.k_splits * self.tiles(cols) * (self.column_groups * self.row_groups * 128 + self.row_groups * 8)


class SplitScratch:
    """Global memory for launches that split the inner dimension over blocks: partial sums and a
    counter a column tile (zero between calls). One per model: products that run at the same time
    on two streams must not share one."""

    def __init__(self, device: torch.device, floats: int = 1 << 21, tiles: int = 1 << 12):
        self.partials = torch.empty(floats, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(tiles, dtype=torch.int32, device=device)

    def holds(self, launch: Launch, cols: int) -> bool:
        return (launch.split_floats(cols) <= self.partials.numel()
                and launch.tiles(cols) <= self.arrivals.numel())


def inner_multiple(weight_int8: bool) -> int:
    """The inner size must be a multiple of this (one warp's chunk)."""
    return 64 if weight_int8 else 32


def row_groups_for(rows: int) -> int:
    return 1 if rows <= 8 else 2 if rows <= 16 else 4 if rows <= 32 else 8


def launch_for(rows: int, cols: int, inner: int, weight_int8: bool) -> Launch:
    """A default where nothing was timed: the warps of a block split the inner dimension so that
    each has about 4 chunks; wide products share each activation load among more columns."""
    chunks = inner // inner_multiple(weight_int8)
    launch = Launch(row_groups_for(rows), 2 if cols >= 4096 else 1,
                    min(16, max(2, 1 << max(0, (chunks // 4 - 1).bit_length()))))
    while not launch.fits():
        launch = Launch(launch.row_groups, launch.column_groups, launch.warps // 2)
    return launch


MAX_NORM_ROWS = 16  # a normed product (a fused decode layer) takes at most two 8-row groups


@dataclass(frozen=True)
class Rope:
    """Where a q|k|v product's rotary epilogue writes: the rotated queries into q_out [rows,
    heads, head_dim], the rotated keys and the values into one layer's caches [slots, positions,
    kv_heads, head_dim] at each row's slot and position (int64 [rows]); cos and sin are the
    model's tables [positions, head_dim], bf16."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    q_out: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def args(self) -> "_RopeArgs":
        heads, head_dim = self.q_out.shape[1], self.q_out.shape[2]
        for t in (self.q_out, self.k_cache, self.v_cache, self.cos, self.sin):
            if t.dtype != torch.bfloat16 or not t.is_contiguous():
                raise ValueError("rotary operands must be contiguous bf16")
        if self.positions.dtype != torch.int64 or self.slots.dtype != torch.int64:
            raise ValueError("positions and slots must be int64")
        return _RopeArgs(self.cos.data_ptr(), self.sin.data_ptr(), self.positions.data_ptr(), self.slots.data_ptr(),
                         self.q_out.data_ptr(), self.k_cache.data_ptr(), self.v_cache.data_ptr(), heads,
                         self.k_cache.shape[2], head_dim, self.k_cache.stride(0), self.k_cache.stride(1))


class _RopeArgs(ctypes.Structure):
    """skinny_gemm.cu's RopeArgs."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("cos", "sin", "positions", "slots", "q_out", "k_cache",
                                                     "v_cache")] + \
               [(name, ctypes.c_int) for name in ("heads", "kv_heads", "head_dim")] + \
               [(name, ctypes.c_int64) for name in ("slot_stride", "position_stride")]


class SkinnyGemm:
    """The loaded library: out = x @ w.T (* scale per column) (+ bias), for 1-64 rows, optionally
    with a fused epilogue (the .cu file's top comment): each row scaled by 1 / rms(x row), a
    residual added, gate/up column pairs combined as silu(gate) * up, or q|k|v rotated into the
    queries and the KV cache."""

    def __init__(self, library: ctypes.CDLL):
        self._fn = library.bass_skinny_gemm
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 10 + [ctypes.c_void_p] * 3
                             + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.POINTER(_RopeArgs),
                                ctypes.c_void_p])

    def supports(self, rows: int, inner: int, weight_int8: bool) -> bool:
        return 1 <= rows <= MAX_ROWS and inner % inner_multiple(weight_int8) == 0

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
                 out: torch.Tensor, launch: Launch | None = None, split: SplitScratch | None = None, *,
                 residual: torch.Tensor | None = None, norm_eps: float | None = None,
                 silu_pairs: bool = False, rope: Rope | None = None) -> torch.Tensor:
        """x [rows, K] bf16 contiguous; weight [N, K] int8 (with fp32 scale [N]) or bf16; out
        [rows, N] bf16 or fp32 ([rows, N / 2] bf16 with silu_pairs); split: the scratch of a
        launch with k_splits > 1. residual: bf16 [rows, N] added to the product (out may be the
        same tensor); norm_eps: scale row r by 1 / sqrt(mean(x[r]^2) + eps) (<= 16 rows); rope:
        the product is q|k|v with its query and key heads' columns paired for the rotation
        (engine/fused_layers.py): written where `rope` says, `out` untouched (returns q_out)."""
        rows, inner = x.shape
        cols = weight.shape[0]
        weight_int8 = weight.dtype == torch.int8
        launch = launch or launch_for(rows, cols, inner, weight_int8)
        if launch.k_splits > 1 and (split is None or not split.holds(launch, cols)):
            raise ValueError(f"{launch} needs a SplitScratch that holds {launch.split_floats(cols)} partial sums")
        if norm_eps is not None and launch.row_groups > MAX_NORM_ROWS // 8:
            raise ValueError(f"a normed product takes at most {MAX_NORM_ROWS} rows, got {launch}")
        partials, arrivals = (split.partials.data_ptr(), split.arrivals.data_ptr()) if launch.k_splits > 1 else (None, None)
        err = self._fn(x.data_ptr(), weight.data_ptr(), scale.data_ptr() if scale is not None else None,
                       bias.data_ptr() if bias is not None else None, out.data_ptr(), rows, cols, inner,
                       int(weight_int8), int(out.dtype == torch.float32), launch.row_groups, launch.column_groups,
                       launch.warps, launch.blocks_per_sm, launch.k_splits, partials, arrivals,
                       residual.data_ptr() if residual is not None else None, int(norm_eps is not None),
                       float(norm_eps or 0.0), int(silu_pairs),
                       ctypes.byref(rope.args()) if rope is not None else None,
                       torch.cuda.current_stream(x.device).cuda_stream)
        if err:
            raise RuntimeError(f"skinny_gemm launch failed (cudaError {err}): rows={rows} cols={cols} "
                               f"inner={inner} int8={weight_int8} {launch} residual={residual is not None} "
                               f"norm={norm_eps is not None} silu_pairs={silu_pairs} rope={rope is not None}")
        return rope.q_out if rope is not None else out


def load_skinny_gemm(device: torch.device) -> SkinnyGemm | None:
    """The few-row products of the kernel library for `device` (kernels/cuda_library.py); None
    where it cannot be built or loaded (the caller keeps its Triton / cuBLAS products)."""
    library = load_for_device(device, "few-row products stay on Triton / cuBLAS")
    return SkinnyGemm(library) if library is not None else None
