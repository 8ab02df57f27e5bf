"""The Gumbel race of a batch of logit rows in one Triton launch (reference: engine/sampling.race).

Per row: scale by the temperature, drop tokens under the top-k / top-p cut, add the keyed
Gumbel noise of (row key, token id), take the argmax. The reference builds int64 hash
temporaries of the whole [rows, vocab] block, about twenty launches and ~50 bytes of traffic
per logit; here each program hashes one block of a row in registers and writes only its best
(score, token), and a two-element reduction per row picks the winner.

Programs are (row, vocabulary block), so 40 rows x 152k tokens fill the GPU; each row's result
depends on that row alone, never on the batch around it. The hash is the reference's
lowbias32 in uint64 arithmetic masked to 32 bits, bit-identical to it; the float transform may
round differently in the last place, which can move only near-exact ties.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

_BLOCK = 4096


@triton.jit
def _mix32(x):
    """lowbias32 on uint64 values < 2**32 (products masked back to 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _race_kernel(logits_ptr, temperature_ptr, cut_ptr, keys_ptr, greedy_ptr, best_ptr, best_id_ptr,
                 vocab, row_stride, num_blocks, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    x = tl.load(logits_ptr + row * row_stride + cols, mask=in_vocab, other=0.0).to(tl.float32)
    scaled = x / tl.load(temperature_ptr + row)
    keep = in_vocab & (scaled >= tl.load(cut_ptr + row))
    key = tl.load(keys_ptr + row).to(tl.uint64)
    h = _mix32(key ^ cols.to(tl.uint64))
    h = _mix32((h + 0x68E31DA4) & 0xFFFFFFFF)
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    noise = -tl.log(-tl.log(u))
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
