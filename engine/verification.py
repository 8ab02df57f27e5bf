"""Speculative verification as a pure function (no model, no state, no hidden randomness).

Every position's token is decided by the target alone: greedy rows take the argmax, sampled
rows the winner of the keyed Gumbel race over the target's shaped distribution
(`sampling.race`), an exact sample of it. The draft runs the same race over its own
distribution with the same keyed noise, so it proposes the target's token as often as the
two distributions allow (Gumbel coupling: at least (1 - TV) / (1 + TV) per token, at most
1 - TV). Verification is then one rule for greedy and sampled rows alike: accept the longest
prefix of drafts that equals the target's tokens, then emit the target's token at the first
position that differs (or after the last draft).

The output law is exactly the target's, for any draft (Daliri, Musco, Suresh: drafter-invariant
speculative decoding), and the emitted text depends on nothing but the target's
distributions and the sequence's seed: not on draft lengths, on the draft's availability, or on
the batch.
"""

from __future__ import annotations

import torch

from bass.engine.transfer import to_device


def pad_rows(rows: torch.Tensor, counts: list[int], width: int) -> torch.Tensor:
    """Packed rows [sum(counts), ...] to [len(counts), width, ...], zero-filled; a free view
    when every count equals width (the common case under a batch-level draft length)."""
    if all(c == width for c in counts):
        return rows.view(len(counts), width, *rows.shape[1:])
    out = rows.new_zeros(len(counts), width, *rows.shape[1:])
    seq = [b for b, c in enumerate(counts) for _ in range(c)]
    offset = [j for c in counts for j in range(c)]
    out[to_device(seq, torch.int64, rows.device), to_device(offset, torch.int64, rows.device)] = rows
    return out


def accept_matching_prefix(target_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                           draft_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    target_tokens: [B, K+1] int64, the target's token at each of the k + 1 positions
                   (entries past draft_lens[b] + 1 are ignored)
    draft_tokens:  [B, K] int64 (entries past draft_lens are ignored)
    draft_lens:    [B] int64, 0..K
    returns (accepted [B] int64, tokens [B, K+1] int64): sequence b emits
            tokens[b, :accepted[b] + 1], which equals target_tokens[b, :accepted[b] + 1].
    """
    num_seqs, max_k = draft_tokens.shape
    if max_k == 0:
        return torch.zeros(num_seqs, dtype=torch.int64, device=target_tokens.device), target_tokens[:, :1]
    in_range = torch.arange(max_k, device=draft_tokens.device)[None, :] < draft_lens[:, None]
    ok = (draft_tokens == target_tokens[:, :max_k]) & in_range
    accepted = ok.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    return accepted, target_tokens


def verdict_columns(raced: torch.Tensor, redo: torch.Tensor | None, drafts: torch.Tensor, draft_lens: torch.Tensor,
                    rows_per_seq: list[int]) -> torch.Tensor:
    """What a Verify reads back, per sequence: [accepted, the k + 1 tokens, then (when redo
    is given) a flag per row], int64 [B, 2 + 2K or 1 + K], from the target's token at every
    row (raced, packed [sum(rows_per_seq)]), the rows whose token must be decided again
    (redo, bool, same rows) and the drafts ([B, K], draft_lens [B])."""
    width = drafts.shape[1] + 1
    accepted, tokens = accept_matching_prefix(pad_rows(raced, rows_per_seq, width), drafts, draft_lens)
    columns = [accepted[:, None], tokens]
    if redo is not None:
        columns.append(pad_rows(redo.to(torch.int64), rows_per_seq, width))
    return torch.cat(columns, dim=1)
