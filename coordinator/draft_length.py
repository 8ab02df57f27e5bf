"""Draft-length policies: how many tokens the draft proposes for each sequence this step.

A policy sees, after every step, how many tokens each sequence was offered and accepted.
Length 0 means regular decoding for that sequence.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

from bass.config import DraftLengthConfig


class DraftLengthPolicy(Protocol):
    def lengths(self, seq_ids: Sequence[int]) -> list[int]: ...
    def observe(self, seq_ids: Sequence[int], proposed: Sequence[int], accepted: Sequence[int]) -> None: ...
    def forget(self, seq_id: int) -> None: ...


class FixedLength:
    def __init__(self, k: int):
        self.k = k

    def lengths(self, seq_ids):
        return [self.k] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        pass

    def forget(self, seq_id):
        pass


class BassRule:
    """BASS's batch-level rule (Qian et al. 2024): one length for the whole batch.

    Start at `initial`; if any sequence accepted all its draft tokens, l = min(l + 2, max) and
    s = 0; otherwise l = max(1, longest accepted run, l - ceil(l / 10) - s) and s = 1.
    """

    def __init__(self, initial: int = 7, max_length: int = 32):
        self.length, self.max_length, self.shrink = initial, max_length, 0

    def lengths(self, seq_ids):
        return [self.length] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        offered = [(k, a) for k, a in zip(proposed, accepted) if k > 0]
        if not offered:
            return
        if any(a == k for k, a in offered):
            self.length, self.shrink = min(self.length + 2, self.max_length), 0
        else:
            longest = max(a for _, a in offered)
            self.length = max(1, longest, self.length - math.ceil(self.length / 10) - self.shrink)
            self.shrink = 1

    def forget(self, seq_id):
        pass


class PerSequenceAdaptive:
    """Each sequence picks the length that maximizes its expected tokens per unit of step cost.

    With per-token acceptance a, k draft tokens yield E(k) = (1 - a^(k+1)) / (1 - a) tokens for
    a cost of 1 + c*k target-forward times (c = draft/target cost ratio). a is a decayed
    estimate from the sequence's own history: accepting m of k counts m successes and, when
    m < k, one failure. With no fresh evidence (k = 0) the estimate drifts back to the prior,
    so a sequence that stopped drafting tries again later.
    """

    def __init__(self, cost_ratio: float, max_length: int, prior: float = 0.7, prior_weight: float = 2.0,
                 decay: float = 0.8):
        self.cost_ratio, self.max_length = cost_ratio, max_length
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self._stats: dict[int, tuple[float, float]] = {}  # seq_id -> (successes, trials)

    def acceptance(self, seq_id: int) -> float:
        s, n = self._stats.get(seq_id, (0.0, 0.0))
        return (s + self.prior * self.prior_weight) / (n + self.prior_weight)

    def best_length(self, a: float) -> int:
        a = min(a, 0.999)
        gains = [((1 - a ** (k + 1)) / (1 - a)) / (1 + self.cost_ratio * k) for k in range(self.max_length + 1)]
        return max(range(len(gains)), key=gains.__getitem__)

    def lengths(self, seq_ids):
        return [self.best_length(self.acceptance(i)) for i in seq_ids]

    def observe(self, seq_ids, proposed, accepted):
        for seq_id, k, m in zip(seq_ids, proposed, accepted):
            s, n = self._stats.get(seq_id, (0.0, 0.0))
            trials = m + (1 if m < k else 0)
            self._stats[seq_id] = (s * self.decay + m, n * self.decay + trials)

    def forget(self, seq_id):
        self._stats.pop(seq_id, None)


def make_policy(config: DraftLengthConfig) -> DraftLengthPolicy:
    if config.policy == "fixed":
        return FixedLength(config.fixed)
    if config.policy == "bass":
        return BassRule(config.initial, config.max_length)
    return PerSequenceAdaptive(config.cost_ratio, config.max_length)
