"""Few-row products on the tensor cores from CUDA C++ (kernels/cuda/skinny_gemm.cu), built on the
machine that runs them.

Triton has no way to issue a lane's weight loads for several chunks of the inner dimension before
it multiplies any (its pipeliner keeps a few tiles in flight, in order), and at 1-16 rows that is
what a product costs: DRAM round trips, not bytes. The .cu file says how the kernel avoids them.

Built once per machine with the CUDA compiler (`nvcc`, found on PATH or under CUDA_HOME) into
BASS_KERNEL_CACHE (default ~/.cache/bass/kernels), keyed by the source's hash and the GPU's
architecture; loaded with ctypes and launched on PyTorch's current stream, so CUDA graphs capture
it like any other launch. Where there is no compiler or no GPU, `load_skinny_gemm` returns None and
callers keep their Triton / cuBLAS path. `bass build-kernels` builds it ahead of the first load;
deploy/docker/Dockerfile's kernels stage builds it into the image.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cuda") / "skinny_gemm.cu"
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

    def __init__(self, library: ctypes.CDLL, programmatic: bool = False):
        """programmatic: launch every product with programmatic dependent launch (Hopper and
        newer): it starts while the kernel before it runs, loading its first weights, and waits
        for that kernel only before it reads what the kernel wrote (the .cu file's
        wait_for_prior_grid). Same values; the boundary between launches is overlapped."""
        self.programmatic = programmatic
        self._fn = library.bass_skinny_gemm
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 10 + [ctypes.c_void_p] * 3
                             + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.POINTER(_RopeArgs),
                                ctypes.c_int, ctypes.c_void_p])

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
                       ctypes.byref(rope.args()) if rope is not None else None, int(self.programmatic),
                       torch.cuda.current_stream(x.device).cuda_stream)
        if err:
            raise RuntimeError(f"skinny_gemm launch failed (cudaError {err}): rows={rows} cols={cols} "
                               f"inner={inner} int8={weight_int8} {launch} residual={residual is not None} "
                               f"norm={norm_eps is not None} silu_pairs={silu_pairs} rope={rope is not None}")
        return rope.q_out if rope is not None else out


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home, "bin", "nvcc") if home else None
    return str(candidate) if candidate is not None and candidate.exists() else None


def cache_dir() -> Path:
    return Path(os.environ.get("BASS_KERNEL_CACHE", Path.home() / ".cache" / "bass" / "kernels"))


def load_skinny_gemm(device: torch.device, programmatic: bool = False) -> SkinnyGemm | None:
    """The kernel library for `device`'s architecture, compiled on first use; None where it cannot
    be (no CUDA device, no nvcc, or the build failed: logged, and the caller keeps its fallback).
    programmatic: launch with programmatic dependent launch where the GPU has it (sm_90+)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:  # bf16 mma.sync needs Ampere or newer
        return None
    return load_library(f"{major}{minor}", programmatic=programmatic and major >= 9)


def load_library(arch: str, programmatic: bool = False) -> SkinnyGemm | None:
    """The library built for sm_`arch` from the cache, compiled into it first where it is not
    there; None (with a warning: the products keep their fallback) where that cannot be done:
    no nvcc, a compiler error, a cache that cannot be written or a file that does not load."""
    target = cache_dir() / library_name(arch)
    fallback = "few-row products stay on Triton / cuBLAS"
    try:
        if not target.exists():
            nvcc = find_nvcc()
            if nvcc is None:
                log.warning("no nvcc on PATH or under CUDA_HOME: %s", fallback)
                return None
            log.info("compiling %s for sm_%s into %s (once per machine, ~30 s)", _SOURCE.name, arch, target)
            started = time.monotonic()
            error = build_library(nvcc, arch, target)
            if error is not None:
                log.warning("building %s failed; %s:\n%s", _SOURCE.name, fallback, error)
                return None
            log.info("compiled %s in %.1f s", _SOURCE.name, time.monotonic() - started)
        return SkinnyGemm(ctypes.CDLL(str(target)), programmatic=programmatic)
    except OSError as exc:  # an unwritable cache (BASS_KERNEL_CACHE), a truncated library
        log.warning("few-row CUDA kernel unavailable (%s); %s", exc, fallback)
        return None


def library_name(arch: str) -> str:
    """The built library's file name: the source's hash (a new source is rebuilt) and the GPU
    architecture. deploy/docker/Dockerfile's kernels stage builds the same names."""
    return f"skinny_gemm-{hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]}-sm{arch}.so"


def build_library(nvcc: str, arch: str, target: Path) -> str | None:
    """Compile the kernel for sm_`arch` into the shared library `target`; the compiler's error
    output where it fails, else None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
               "-o", str(built), str(_SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            return result.stderr[-2000:] or f"nvcc exited with {result.returncode}"
        os.replace(built, target)  # atomic: a concurrent loader sees the whole file or none
    return None
