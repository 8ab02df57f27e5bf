"""Lookup tokens after the draft's, found on the device: a verification's rows for nothing.

A verification of k drafts costs about what one of k + 2 does (at 1 and 8 sequences on an
H200, 0.002-0.004 ms a row against a 1.8 ms step), and code repeats itself. So after the draft's
k tokens, the target also verifies `m` tokens that continue them the way the sequence's own text
continued the same tokens before: the n-gram (n = 3, 2, 1, longest first) that ends the
sequence's text plus its drafts is looked up in that text, and what followed its most recent
occurrence is appended (prompt lookup decoding, Saxena 2023, run after the draft instead of in
its place). Where every draft is accepted, the target may take some of these too; where it
does not, they cost a row each. Lossless either way: the target decides every position.

The draft's tokens never reach the host before the verification (it is queued behind the
draft's forwards, target_service/worker.py), so the lookup runs on the device, over the last
`window` committed tokens the host stages and the drafts where they are. Replayed over the
target's greedy text of HumanEval's first 16 prompts, two such tokens after k = 3 drafts cut the
modelled time a token by 11% at one sequence and 4% at eight (bench/cpu/drafter_model.py).
"""

from __future__ import annotations

import numpy as np
import torch

from bass.core.config import LOOKUP_WINDOW

LOOKUP_NGRAM = 3  # the longest n-gram looked up
PAD = -1  # left padding of the staged text (never a token)


def stage_text(texts: list[list[int]], window: int = LOOKUP_WINDOW) -> torch.Tensor:
    """The last `window` tokens of each text, right-aligned, padded on the left: int64 [B, window]
    on the host (the caller copies it to the device), through one NumPy array rather than a
    tensor a row."""
    out = np.full((len(texts), window), PAD, dtype=np.int64)
    for row, text in enumerate(texts):
        tail = text[-window:]
        if tail:
            out[row, window - len(tail):] = tail
    return torch.from_numpy(out)


def lookup_tail(text: torch.Tensor, drafts: torch.Tensor, m: int, longest: int = LOOKUP_NGRAM) -> torch.Tensor:
    """m tokens per row to verify after the drafts.

    text: [B, W] int64, each row's committed tokens right-aligned (PAD on the left); drafts:
    [B, k] int64 (k >= 0), on the same device. Per row, in `text` followed by `drafts` (call it
    s, of length L = W + k): the longest n <= `longest` whose last n tokens s[L-n:] occur
    earlier in s, at an occurrence with a token after it; the tokens after the most recent such
    occurrence, s[e:e+m] (e: that occurrence's end). Positions past s's end, and rows without
    any occurrence, take the row's last token (which the target will rarely accept; they are
    verified either way). Returns int64 [B, m]. No host sync. On a GPU one Triton launch
    (kernels/triton_lookup.py); these tensor ops are its reference, and the CPU's path.
    """
    if text.is_cuda and longest == LOOKUP_NGRAM:
        from bass.kernels.triton_lookup import lookup_tail as one_launch

        return one_launch(text, drafts, m)
    s = torch.cat([text, drafts], dim=1)
    num, length = s.shape
    device = s.device
    fill = s[:, -1:]
    padded = torch.cat([s, fill.expand(num, m)], dim=1)
    best_end = torch.full((num,), -1, dtype=torch.int64, device=device)
    for n in range(1, min(longest, length - 1) + 1):  # shorter first: a longer match overrides
        # Occurrences ending at e in [n, L - 1] (a token follows them): s[e - n + j] == s[L - n + j].
        span = length - n  # candidate ends e = n .. L - 1, i.e. start i = e - n = 0 .. span - 1
        match = torch.ones((num, span), dtype=torch.bool, device=device)
        for j in range(n):
            match &= s[:, j:j + span] == s[:, length - n + j:length - n + j + 1]
        match &= s[:, length - n:length].ne(PAD).all(dim=1, keepdim=True)  # a suffix of real tokens
        ends = torch.arange(n, n + span, device=device)
        last = torch.where(match, ends, torch.full_like(ends, -1)).amax(dim=1)
        best_end = torch.where(last >= 0, last, best_end)
    found = best_end >= 0
    start = torch.where(found, best_end, torch.full_like(best_end, length))  # not found: the fill
    columns = start[:, None] + torch.arange(m, device=device)[None, :]
    return padded.gather(1, columns)
