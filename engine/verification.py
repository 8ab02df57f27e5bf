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
