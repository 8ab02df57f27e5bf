"""Turning logits into tokens: distribution shaping, keyed randomness, sampling, compact q.

Shaping (temperature, top-k, top-p) is the single definition of "the distribution a sequence
samples from"; regular decoding, the draft and the verifier all call it, which is why
speculative and regular decoding sample one and the same distribution. Greedy rows become a
one-hot distribution on the argmax, so the verifier needs no special case for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from bass.config import SamplingParams

# Purposes of a uniform draw, mixed into its key so they never share randomness.
DRAFT_SAMPLE, ACCEPT_TEST, TARGET_SAMPLE = 1, 2, 3

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanching 32-bit integer hash ("lowbias32") on int64 tensors holding values < 2**32.

    Products may wrap past int64, but masking keeps their low 32 bits exact, so CPU and GPU
    agree bit for bit.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def keyed_uniform(seed_keys: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """Uniforms in (0, 1), a pure function of (seed key, position, purpose): float32, shaped like
    `positions` (seed_keys broadcasts)."""
    keys = seed_keys.to(torch.int64)
    lo, hi = keys & _M32, (keys >> 32) & _M32
    h = _mix32(lo ^ (purpose * 0x9E3779B9 & _M32))
    h = _mix32(h ^ hi)
    h = _mix32(h ^ (positions.to(torch.int64) & _M32))
    h = _mix32(h + 0x68E31DA4 & _M32)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def seed_key_tensor(keys: list[int], device: torch.device | str) -> torch.Tensor:
    """uint64 seed keys as int64 (two's complement) for tensor hashing."""
    return torch.tensor([k - (1 << 64) if k >= 1 << 63 else k for k in keys], dtype=torch.int64,
                        device=device)


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters as tensors, so one batch can mix settings."""

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_k: torch.Tensor  # [R] int64, 0 = off
    top_p: torch.Tensor  # [R] float32
    all_greedy: bool
    any_greedy: bool
    any_truncation: bool
    max_top_k: int  # known on the host, so that choosing a code path needs no device sync

    @classmethod
    def build(cls, params: list[SamplingParams], device: torch.device | str) -> "RowParams":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            all_greedy=all(p.greedy for p in params),
            any_greedy=any(p.greedy for p in params),
            any_truncation=any(p.top_k > 0 or p.top_p < 1 for p in params if not p.greedy),
            max_top_k=max((p.top_k for p in params), default=0),
        )

    def take(self, index: torch.Tensor) -> "RowParams":
        """The rows at `index` (flags stay conservative: they may over-report)."""
        return replace(self, temperature=self.temperature[index], top_k=self.top_k[index],
                       top_p=self.top_p[index])


def shape_probs(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """Probabilities [R, V] (fp32) after temperature, top-k and top-p; greedy rows are one-hot."""
    logits = logits.float()
    if rows.all_greedy:
        return _one_hot_argmax(logits)
    temperature = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    if rows.any_truncation:
        probs = _truncate(probs, rows.top_k, rows.top_p)
    if rows.any_greedy:
        greedy = (rows.temperature == 0)[:, None]
        probs = torch.where(greedy, _one_hot_argmax(logits), probs)
    return probs


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(logits, dtype=torch.float32)
    return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def _truncate(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k most likely tokens (0 = all) and, of those, the smallest set whose
    mass reaches top_p; renormalize. Ties are broken by the sort, as in plain sampling.

    A full sort per row. (Searching the cut in each row's top 1024 first, with a fallback,
    gained nothing end to end on an H100: bench/results, b26bdb7.)"""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, probs.shape[-1]))
    keep = rank < k[:, None]
    sorted_p = sorted_p * keep
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    keep = keep & (mass_before < top_p[:, None] * sorted_p.sum(-1, keepdim=True))
    keep[:, 0] = True
    sorted_p = sorted_p * keep
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row of `probs` (need not be normalized) for the
    given uniforms. Zero-probability tokens are never chosen."""
    cdf = probs.cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def compact_shaped(logits: torch.Tensor, rows: RowParams, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """compact(shape_probs(logits, rows), top_n), computed from each row's top_n logits.

    Shaping keeps a prefix of each row's tokens sorted by probability, so the top_n tokens of
    the shaped distribution are the first top_n of that order, and the top-p cut inside them
    needs only their probabilities (a softmax normalizer over the vocabulary gives those).
    This skips sorting, cumulating and scattering whole vocabulary rows: one top-k and one
    log-sum-exp per row. A top_k beyond top_n would need the mass of tokens outside the
    window; those batches take the full path.
    """
    n = min(top_n, logits.shape[-1])
    if rows.all_greedy or rows.max_top_k > n:
        return compact(shape_probs(logits, rows), top_n)
    temperature = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
    scaled = logits.float() / temperature[:, None]
    top, ids = scaled.topk(n, dim=-1)  # sorted, descending
    probs = torch.exp(top - torch.logsumexp(scaled, dim=-1, keepdim=True))
    if rows.any_truncation:
        rank = torch.arange(n, device=logits.device)[None, :]
        keep = (rows.top_k[:, None] == 0) | (rank < rows.top_k[:, None])
        probs = probs * keep
        # The top-p cut is relative to the mass top_k kept: all of it (1) without top_k.
        kept_mass = torch.where(rows.top_k > 0, probs.sum(-1), torch.ones_like(rows.top_p))
        mass_before = probs.cumsum(dim=-1) - probs
        keep = keep & (mass_before < rows.top_p[:, None] * kept_mass[:, None])
        keep[:, 0] = True
        probs = probs * keep
    if rows.any_greedy:
        first = torch.zeros_like(probs)
        first[:, 0] = 1.0
        probs = torch.where((rows.temperature == 0)[:, None], first, probs)
    return ids, probs / probs.sum(dim=-1, keepdim=True)


def compact(probs: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compact q: each row's top_n tokens with renormalized probabilities.

    The draft samples from exactly this distribution, so the verifier can use it as q and the
    output stays exact; only the acceptance rate depends on top_n.
    """
    n = min(top_n, probs.shape[-1])
    vals, ids = probs.topk(n, dim=-1)
    return ids, vals / vals.sum(dim=-1, keepdim=True)
