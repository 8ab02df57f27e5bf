"""The Gumbel race of a batch of logit rows in one Triton launch (reference: engine/sampling.race).

Per row: scale by the temperature, drop tokens under the top-k / top-p cut, add the keyed
Gumbel noise of (row key, token id), take the argmax. The reference builds int64 hash
temporaries of the whole [rows, vocab] block, about twenty launches and ~50 bytes of traffic
per logit; here each program hashes one block of a row in registers and writes only its best
(score, token), and a two-element reduction per row picks the winner.

Programs are (row, vocabulary block), so even one row of 152k tokens fills the GPU; each row's
result depends on that row alone, never on the batch around it. The hash is the reference's
lowbias32 in native uint32 arithmetic (products wrap to their low 32 bits, which the
reference's masks keep), bit-identical to it; the float transform may round differently in the
last place, which can move only near-exact ties.

This module's kernels are the exact path: a cut from each row's window of largest logits (or a
bisection over the row), then the race. The decode steps race first and cut only where needed
(kernels/triton_race_first.py, which shares the noise and the block size).
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

_BLOCK = 1024  # 149 programs per 152k-token row (4096: 38, and a race took ~0.1 ms at any batch)


@triton.jit
def _mix32(x):
    """lowbias32 on uint32 values (each product wraps to its low 32 bits; the masks are no-ops
    kept from the reference's int64 form)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _noise(key, cols):
    """Gumbel(0, 1) noise of (row key, token ids): engine/sampling.gumbel_noise."""
    h = _mix32(key ^ cols.to(tl.uint32))
    h = _mix32((h + 0x68E31DA4) & 0xFFFFFFFF)
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK: tl.constexpr):
    """A program's block of a row: (token ids, which are in the vocabulary, the logits over the
    row's divisor in fp32)."""
    cols = block * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    x = tl.load(logits_ptr + row * row_stride + cols, mask=in_vocab, other=0.0).to(tl.float32)
    return cols, in_vocab, x / tl.load(divisor_ptr + row)


@triton.jit
def _race_kernel(logits_ptr, temperature_ptr, cut_ptr, keys_ptr, greedy_ptr, best_ptr, best_id_ptr,
                 vocab, row_stride, num_blocks, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols, in_vocab, scaled = _scaled_block(logits_ptr, temperature_ptr, row, block, vocab, row_stride, BLOCK)
    keep = in_vocab & (scaled >= tl.load(cut_ptr + row))
    noise = _noise(tl.load(keys_ptr + row).to(tl.uint32), cols)
    greedy = tl.load(greedy_ptr + row) != 0
    score = tl.where(greedy, scaled, scaled + noise)
    score = tl.where(keep, score, float("-inf"))
    best = tl.max(score, axis=0)
    best_col = tl.argmax(score, axis=0, tie_break_left=True)
    tl.store(best_ptr + row * num_blocks + block, best)
    tl.store(best_id_ptr + row * num_blocks + block, block * BLOCK + best_col)


def gumbel_race(logits: torch.Tensor, temperature: torch.Tensor, cut: torch.Tensor, row_keys: torch.Tensor,
                greedy: torch.Tensor) -> torch.Tensor:
    """Winners int64 [R] of logits [R, V] (any float dtype, rows contiguous).

    temperature: fp32 [R], 1 for greedy rows; cut: fp32 [R], the smallest kept scaled logit
    (-inf: keep all); row_keys: int64 [R] < 2**32 (sampling.noise_keys); greedy: bool [R], rows
    that take the plain argmax (no noise)."""
    rows, vocab = logits.shape
    if not temperature.numel() == cut.numel() == greedy.numel() == rows or row_keys.numel() != rows:
        raise ValueError(f"{rows} logit rows need as many temperatures, cuts, keys and greedy flags")
    logits = logits.contiguous()
    num_blocks = triton.cdiv(vocab, _BLOCK)
    best = torch.empty(rows, num_blocks, dtype=torch.float32, device=logits.device)
    best_id = torch.empty(rows, num_blocks, dtype=torch.int64, device=logits.device)
    if rows:
        _race_kernel[(rows, num_blocks)](logits, temperature.float().contiguous(), cut.float().contiguous(),
                                         row_keys.contiguous(), greedy.to(torch.int8).contiguous(), best, best_id,
                                         vocab, logits.stride(0), num_blocks, BLOCK=_BLOCK)
    return best_id.gather(-1, best.argmax(dim=-1, keepdim=True)).squeeze(-1)


@triton.jit
def _window_cut_kernel(top_ptr, lse_ptr, top_k_ptr, top_p_ptr, cut_ptr, inside_ptr, width, top_stride,
                       BLOCK: tl.constexpr):
    """One program per row: engine/sampling._cut_in_window_reference over the row's window."""
    row = tl.program_id(0)
    rank = tl.arange(0, BLOCK)
    valid = rank < width
    top = tl.load(top_ptr + row * top_stride + rank, mask=valid, other=float("-inf")).to(tl.float32)
    probs = tl.exp(top - tl.load(lse_ptr + row))
    top_k = tl.load(top_k_ptr + row)
    by_k = valid & ((top_k == 0) | (rank < top_k))
    by_rank = tl.where(by_k, probs, 0.0)
    # The top-p cut is relative to the mass top_k kept: all of it (1) without top_k.
    kept_mass = tl.where(top_k > 0, tl.sum(by_rank, axis=0), 1.0)
    keep = by_k & (tl.cumsum(by_rank, axis=0) - by_rank < tl.load(top_p_ptr + row) * kept_mass)
    kept = tl.sum(keep.to(tl.int32), axis=0)
    inside = tl.where(top_k > 0, top_k <= width, kept < width)
    last = tl.maximum(kept, 1) - 1
    tl.store(cut_ptr + row, tl.max(tl.where(rank == last, top, float("-inf")), axis=0))
    tl.store(inside_ptr + row, inside.to(tl.int8))


def window_cut(top: torch.Tensor, lse: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """engine/sampling._cut_in_window_reference in one launch (it is ~15 small PyTorch ops,
    ~0.3 ms of host launches per sampled step): top [R, W] each row's largest scaled logits,
    descending; lse [R] or [R, 1] the rows' log-sum-exp; top_k int [R]; top_p float [R].
    Returns (cut fp32 [R], inside bool [R])."""
    rows, width = top.shape
    cut = torch.empty(rows, dtype=torch.float32, device=top.device)
    inside = torch.empty(rows, dtype=torch.int8, device=top.device)
    if rows:
        _window_cut_kernel[(rows,)](top.contiguous(), lse.float().contiguous(), top_k.contiguous(),
                                    top_p.float().contiguous(), cut, inside, width, width,
                                    BLOCK=triton.next_power_of_2(width))
    return cut, inside.bool()


@triton.jit
def _ordered(bits):
    """int32 bits of fp32 values -> int32 keys in the values' order (an involution)."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _nucleus_cut_kernel(scaled_ptr, lse_ptr, top_p_ptr, need_ptr, cut_ptr, vocab, row_stride,
                        BLOCK: tl.constexpr):
    """One program per row; rows whose `need` flag is set get the exact top-p cut over the whole
    row: the smallest value v with mass(x > v) < top_p, found by bisection over the values'
    ordered bit patterns (one pass over the row per step, at most 32 steps)."""
    row = tl.program_id(0)
    if tl.load(need_ptr + row) != 0:
        lse = tl.load(lse_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        base = scaled_ptr + row * row_stride
        lo = _ordered(tl.load(base).to(tl.int32, bitcast=True)).to(tl.int64)
        hi = lo
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < vocab
            keys = _ordered(tl.load(base + cols, mask=valid, other=0.0).to(tl.int32, bitcast=True)).to(tl.int64)
            lo = tl.minimum(lo, tl.min(tl.where(valid, keys, hi), axis=0))
            hi = tl.maximum(hi, tl.max(tl.where(valid, keys, lo), axis=0))
        # The answer lies in [lo, hi]: nothing lies above the largest value (mass 0 < top_p).
        while lo < hi:
            mid = lo + (hi - lo) // 2
            acc = tl.zeros((BLOCK,), tl.float32)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                valid = cols < vocab
                x = tl.load(base + cols, mask=valid, other=0.0)
                above = valid & (_ordered(x.to(tl.int32, bitcast=True)).to(tl.int64) > mid)
                acc += tl.where(above, tl.exp(x - lse), 0.0)
            if tl.sum(acc, axis=0) < top_p:
                hi = mid
            else:
                lo = mid + 1
        tl.store(cut_ptr + row, _ordered(lo.to(tl.int32)).to(tl.float32, bitcast=True))


def nucleus_cut(scaled: torch.Tensor, lse: torch.Tensor, top_p: torch.Tensor, need: torch.Tensor,
                cut: torch.Tensor) -> None:
    """Where `need` (bool [R]) is set, write into `cut` (fp32 [R]) the row's exact top-p cut
    (no top-k) over the whole of scaled [R, V] (fp32, rows contiguous), lse [R] or [R, 1] its
    log-sum-exp: the value of the last token kept by rank, as engine/sampling._cut_in_window_reference
    finds it over the sorted row. For the rows whose nucleus lies beyond the race's window (rare),
    without a sort or a host sync, so it runs inside CUDA graphs; each is one program's bisection
    (~33 passes over its row), the other rows return at once."""
    rows, vocab = scaled.shape
    if triton_attention._INTERPRETED:  # loop bounds from tensors (the interpreter's NumPy fix)
        triton_attention._patch_interpreter_index()
    if rows:
        _nucleus_cut_kernel[(rows,)](scaled.contiguous(), lse.float().contiguous(), top_p.float().contiguous(),
                                     need.to(torch.int8).contiguous(), cut, vocab, vocab, BLOCK=4096,
                                     num_warps=8)
