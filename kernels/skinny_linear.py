"""A model's projections at 1-16 rows through the CUDA few-row kernel (kernels/cuda_skinny.py)
wherever it measured faster than the model's own path on this GPU, when the model was built.

Which launch shape wins, and whether the kernel beats cuBLAS or the Triton int8 kernel at all,
depends on the projection's shape, the number of rows and the GPU (bench/gpu/kernels/
skinny_gemm.py, H200: faster for the small projections and the draft's down, level or slower for
the wide ones and the LM head). So nothing is assumed: at load, each projection shape is timed at
8 and 16 rows in CUDA graphs over the model's own weights (a few seconds), and a plan is kept only
where the kernel wins by a margin. Everything else, and any step of more than 16 rows, keeps the
fallback (F.linear, or kernels/triton_int8.Int8Linear for an int8 draft).

Changes the rounding of the products it takes over (another summation order), like cuBLAS's own
choice of kernel by shape; not used in the batch-invariant mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from bass.kernels.cuda_skinny import Launch, Rope, SkinnyGemm, SplitScratch, launch_for, row_groups_for
from bass.kernels.timing import graph_us

log = logging.getLogger(__name__)

ROW_BUCKETS = (8, 16)  # a plan covers 1-8 rows (timed at 8) or 9-16 (timed at 16)
_MIN_GAIN = 0.03  # a plan must beat the fallback by this fraction: timing noise is ~1%
_NARROW_COLS = 4096  # weights this narrow also try splitting the inner dimension over blocks
PlanKey = tuple[tuple[int, int], torch.dtype, int]  # (weight shape, weight dtype, row bucket)


def _bucket(rows: int) -> int:
    return ROW_BUCKETS[0] if rows <= ROW_BUCKETS[0] else ROW_BUCKETS[1]


def _candidates(rows: int, cols: int, split: SplitScratch) -> list[Launch]:
    """Launch shapes worth timing: a block per tile or a persistent grid, and for narrow weights
    (few column tiles for the multiprocessors) the inner dimension split over 2 or 4 blocks."""
    groups = row_groups_for(rows)
    launches = [Launch(groups, cg, warps, per_sm) for cg in (1, 2) for warps in (4, 8, 16) for per_sm in (0, 2)]
    if cols <= _NARROW_COLS:
        launches += [Launch(groups, cg, warps, 0, ways) for cg in (1, 2) for warps in (4, 8, 16) for ways in (2, 4)]
    return [launch for launch in launches if launch.fits() and (launch.k_splits == 1 or split.holds(launch, cols))]


@dataclass(frozen=True)
class PlanTiming:
    projection: str
    rows: int
    fallback_us: float
    kernel_us: float
    launch: Launch
    chosen: bool


class SkinnyLinear:
    """Called like the fallback: (x, weight, bias=None, out_dtype=None) -> x @ weight.T (+ bias)."""

    def __init__(self, kernel: SkinnyGemm, fallback: Callable, plans: dict[PlanKey, Launch],
                 timings: list[PlanTiming], split: SplitScratch | None = None,
                 best: dict[PlanKey, Launch] | None = None):
        """plans: what the plain products route to the kernel; best: the fastest launch timed for
        every shape and bucket, routed or not (the fused products take the kernel either way)."""
        self.kernel, self.fallback, self.plans, self.timings, self.split = kernel, fallback, plans, timings, split
        self.best = best if best is not None else plans

    def __call__(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        rows = x.shape[0]
        if 0 < rows <= ROW_BUCKETS[-1] and x.dtype == torch.bfloat16 and x.data_ptr() % 16 == 0:
            w = getattr(weight, "q", weight)  # an Int8Weight's int8 matrix, or the weight itself
            launch = self.plans.get((tuple(w.shape), w.dtype, _bucket(rows)))
            if launch is not None:
                out = torch.empty((rows, w.shape[0]), dtype=out_dtype or x.dtype, device=x.device)
                return self.kernel(x if x.is_contiguous() else x.contiguous(), w, getattr(weight, "scale", None),
                                   bias, out, launch, self.split)
        return self.fallback(x, weight, bias) if out_dtype is None else self.fallback(x, weight, bias, out_dtype)

    def fused(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
              residual: torch.Tensor | None = None, norm_eps: float | None = None,
              silu_pairs: bool = False, rope: Rope | None = None) -> torch.Tensor:
        """A product through the kernel with its fused epilogue (SkinnyGemm; engine/fused_layers.py),
        whatever the plan chose for the plain product: the fastest launch timed for its shape
        and rows where there is one, else the default launch."""
        rows = x.shape[0]
        w = getattr(weight, "q", weight)
        cols, inner = w.shape
        launch = self.best.get((tuple(w.shape), w.dtype, _bucket(rows))) or launch_for(rows, cols, inner,
                                                                                        w.dtype == torch.int8)
        if out is None:
            out = rope.q_out if rope is not None else torch.empty((rows, cols // 2 if silu_pairs else cols),
                                                                  dtype=x.dtype, device=x.device)
        return self.kernel(x if x.is_contiguous() else x.contiguous(), w, getattr(weight, "scale", None), bias, out,
                           launch, self.split, residual=residual, norm_eps=norm_eps, silu_pairs=silu_pairs, rope=rope)


def _fits(weight, bias: torch.Tensor | None) -> bool:
    """The kernel reads whole 16-byte words of contiguous rows, and a bf16 bias."""
    w = getattr(weight, "q", weight)
    return (w.is_contiguous() and w.data_ptr() % 16 == 0 and w.dtype in (torch.int8, torch.bfloat16)
            and (bias is None or (bias.is_contiguous() and bias.dtype == torch.bfloat16)))


@torch.inference_mode()
def plan_products(kernel: SkinnyGemm, fallback: Callable,
                  projections: dict[str, list[tuple[object, torch.Tensor | None]]],
                  min_gain: float = _MIN_GAIN) -> SkinnyLinear | None:
    """Time each projection (name -> every layer's (weight, bias)) at each row bucket, the
    fallback against the kernel's candidate launches; a SkinnyLinear that routes the winners
    (those faster by min_gain, a fraction) and knows the best launch of every shape, or None
    where nothing could be timed."""
    plans: dict[PlanKey, Launch] = {}
    best_launches: dict[PlanKey, Launch] = {}
    timings: list[PlanTiming] = []
    split: SplitScratch | None = None
    for name, layers in projections.items():
        w0 = getattr(layers[0][0], "q", layers[0][0])
        cols, inner = w0.shape
        int8 = w0.dtype == torch.int8
        if not kernel.supports(ROW_BUCKETS[-1], inner, int8) or not all(_fits(w, b) for w, b in layers):
            continue
        split = split or SplitScratch(w0.device)
        gen = torch.Generator(device=w0.device).manual_seed(0)
        for rows in ROW_BUCKETS:
            x = torch.randn(rows, inner, device=w0.device, generator=gen).to(torch.bfloat16)
            out = torch.empty(rows, cols, device=w0.device, dtype=torch.bfloat16)
            fallback_us = graph_us(lambda: [fallback(x, w, b) for w, b in layers], len(layers), replays=10, rounds=3)
            best_us, best = float("inf"), None
            for launch in _candidates(rows, cols, split):
                us = graph_us(lambda: [kernel(x, getattr(w, "q", w), getattr(w, "scale", None), b, out, launch, split)
                                       for w, b in layers], len(layers), replays=10, rounds=3)
                if us < best_us:
                    best_us, best = us, launch
            chosen = best_us < (1 - min_gain) * fallback_us
            if best is not None:
                best_launches[((cols, inner), w0.dtype, rows)] = best
            if chosen:
                plans[((cols, inner), w0.dtype, rows)] = best
            timings.append(PlanTiming(name, rows, round(fallback_us, 2), round(best_us, 2), best, chosen))
            log.info("few-row product %s [%d x %d] at %d rows: CUDA kernel %.2f µs, fallback %.2f µs -> %s", name,
                     cols, inner, rows, best_us, fallback_us, "kernel" if chosen else "fallback")
    return SkinnyLinear(kernel, fallback, plans, timings, split, best_launches) if best_launches else None
