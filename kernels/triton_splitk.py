"""The deterministic split K of the Triton products (kernels/triton_int8.py, kernels/triton_matmul.py).

A long inner size leaves few programs, so the kernel splits the K range over a grid axis. Each
split stores its fp32 partial to scratch and bumps its output tile's arrival counter; the last to
arrive sums the partials in split order (the same order every time, so a product repeats bit for
bit) and writes the result, then zeroes the counter, so one buffer of counters serves every
launch without a memset (as in kernels/triton_attention.py).
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def reduce_split_k(acc, part_ptr, arrivals_ptr, tile, mask, split, splits, split_stride, counter_index,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this split's partial `acc` (at offsets `tile` of split `split`'s slice, `split_stride`
    apart, of the fp32 scratch part_ptr) and count it in at arrivals_ptr[counter_index]. Return
    whether this program arrived last of the `splits`, and then the partials summed in order."""
    tl.store(part_ptr + split * split_stride + tile, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial stored before the counter's release
    counter = arrivals_ptr + counter_index
    last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if last:
        for s in range(0, splits):
            total += tl.load(part_ptr + s * split_stride + tile, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(counter, 0)
    return last, total


def split_k_scratch(splits: int, rows: int, cols: int, tiles: int, arrivals: torch.Tensor,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 partials [splits, rows, cols] of a split product and arrival counters for its
    `tiles` output tiles: the caller's zeroed buffer, or a fresh zeroed one where the grid
    outgrows it (a long prefill)."""
    part = torch.empty((splits, rows, cols), dtype=torch.float32, device=device)
    if tiles > arrivals.numel():
        arrivals = torch.zeros(tiles, dtype=torch.int32, device=device)
    return part, arrivals
