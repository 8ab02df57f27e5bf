"""Speculative verification as a pure function (no model, no state, no hidden randomness).

For each sequence b with draft tokens d_1..d_k (k = draft_lens[b]) sampled from compact
distributions q_1..q_k, and target distributions p_1..p_{k+1}:
  - accept d_j while u_j < p_j(d_j) / q_j(d_j) (i.e. with probability min(1, p/q));
  - at the first rejection j, emit a token from norm(max(0, p_j - q_j));
  - if all k are accepted, emit a bonus token from p_{k+1}.
The emitted tokens follow p exactly, for any q (Leviathan et al. 2023; Chen et al. 2023).
With greedy rows p and q are one-hot, and this reduces to "accept the longest prefix that
matches the target's argmax, then emit the target's argmax".
"""

from __future__ import annotations

import torch

from bass.engine.sampling import sample_from


def verify_drafts(p: torch.Tensor, draft_tokens: torch.Tensor, draft_lens: torch.Tensor,
                  q_ids: torch.Tensor, q_probs: torch.Tensor, u_accept: torch.Tensor,
                  u_sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    p:            [B, K+1, V] target probabilities (rows past k+1 of a sequence are ignored)
    draft_tokens: [B, K] int64 (entries past draft_lens are ignored)
    draft_lens:   [B] int64, 0..K
    q_ids:        [B, K, N] int64, q_probs: [B, K, N] — compact draft distributions
    u_accept:     [B, K] uniforms for the acceptance tests
    u_sample:     [B, K+1] uniforms for the final (correction or bonus) token, by the
                  position it may land on (it lands on position accepted[b])
    returns (accepted [B] int64, tokens [B, K+1] int64): sequence b emits
            tokens[b, :accepted[b] + 1].
    """
    num_seqs, max_k = draft_tokens.shape
    rows = torch.arange(num_seqs, device=p.device)
    if max_k == 0:
        return (torch.zeros(num_seqs, dtype=torch.int64, device=p.device),
                sample_from(p[:, 0], u_sample[:, 0])[:, None])

    p_draft = p[:, :max_k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    q_draft = (q_probs * (q_ids == draft_tokens[..., None])).sum(-1)  # [B, K]
    in_range = torch.arange(max_k, device=p.device)[None, :] < draft_lens[:, None]
    ok = (u_accept * q_draft < p_draft) & in_range
    accepted = ok.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # length of the accepted prefix

    # The final token: residual at the first rejection, or a bonus token after full acceptance.
    p_final = p[rows, accepted]  # [B, V]
    rejected = accepted < draft_lens
    q_at = accepted.clamp(max=max_k - 1)
    q_full = torch.zeros_like(p_final).scatter_add_(-1, q_ids[rows, q_at], q_probs[rows, q_at])
    residual = (p_final - q_full).clamp_(min=0)
    # If rounding left no residual mass (p == q up to float error), p itself is the right law.
    has_mass = residual.sum(-1, keepdim=True) > 0
    dist = torch.where(rejected[:, None] & has_mass, residual, p_final)
    final = sample_from(dist, u_sample[rows, accepted])

    tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(num_seqs, 1)], dim=1)
    tokens[rows, accepted] = final
    return accepted, tokens


def verify_greedy(target_argmax: torch.Tensor, draft_tokens: torch.Tensor,
                  draft_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path when every row is greedy: target_argmax [B, K+1]; same outputs as verify_drafts
    with one-hot p and q."""
    num_seqs, max_k = draft_tokens.shape
    rows = torch.arange(num_seqs, device=draft_tokens.device)
    in_range = torch.arange(max_k, device=draft_tokens.device)[None, :] < draft_lens[:, None]
    ok = (draft_tokens == target_argmax[:, :max_k]) & in_range
    accepted = ok.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(num_seqs, 1)], dim=1)
    tokens[rows, accepted] = target_argmax[rows, accepted]
    return accepted, tokens
