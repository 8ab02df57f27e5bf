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
    def observe_costs(self, batch: int, draft_forwards: int, draft_s: float, verify_k: int,
                      verify_s: float) -> None: ...
    def forget(self, seq_id: int) -> None: ...


class _NoCosts:
    """For policies that do not look at step times."""

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s):
        pass


class FixedLength(_NoCosts):
    def __init__(self, k: int):
        self.k = k

    def lengths(self, seq_ids):
        return [self.k] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        pass

    def forget(self, seq_id):
        pass


class BassRule(_NoCosts):
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


class PerSequenceAdaptive(_NoCosts):
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


class _CostModel:
    """Step costs at one batch size, from decayed least squares over recent steps:
    draft seconds per forward, and verification seconds = v0 + v1 * k."""

    def __init__(self, decay: float):
        self.decay = decay
        self.draft = [0.0, 0.0]  # decayed (seconds, forwards)
        self.sums = [0.0] * 5  # decayed weight, sum k, sum k^2, sum v, sum k*v

    def add(self, draft_forwards: int, draft_s: float, k: int, verify_s: float) -> None:
        d = self.decay
        if draft_forwards:
            self.draft = [self.draft[0] * d + draft_s, self.draft[1] * d + draft_forwards]
        w, sk, skk, sv, skv = (x * d for x in self.sums)
        self.sums = [w + 1, sk + k, skk + k * k, sv + verify_s, skv + k * verify_s]

    @property
    def ready(self) -> bool:
        return self.sums[0] > 0 and self.draft[1] > 0

    def draft_cost(self) -> float:
        return self.draft[0] / self.draft[1]

    def verify_cost(self, k: int) -> float:
        w, sk, skk, sv, skv = self.sums
        mean_k, mean_v = sk / w, sv / w
        var = skk / w - mean_k ** 2
        # One k seen so far: assume verification cost does not grow with k (true of a GPU at
        # small batch); exploration then supplies a second k to fit the slope.
        slope = max(0.0, (skv / w - mean_k * mean_v) / var) if var > 1e-6 else 0.0
        return max(1e-9, mean_v + slope * (k - mean_k))


class MeasuredCost(_NoCosts):
    """The batch-level draft length that maximizes measured throughput (our default).

    Tokens per step follow E(k) = (1 - a^(k+1)) / (1 - a) with a the batch's per-token
    acceptance; a step costs k draft forwards plus one verification, both timed as the
    coordinator sees them (RPC included) and modelled per batch-size bucket. It picks
    argmax_k E(k) / cost(k) over 0..max_length, where k = 0 is regular decoding, so speculation
    is used only where it pays. k grows by at most 2 a step (an estimate from one k says little
    about much longer drafts), and every `probe_every` steps it tries a neighbour of the best k
    (k = 1 when the best is 0) to keep the costs and the acceptance estimate current.
    """

    def __init__(self, initial: int = 4, max_length: int = 32, decay: float = 0.9, probe_every: int = 16):
        self.initial, self.max_length, self.decay, self.probe_every = initial, max_length, decay, probe_every
        self.costs: dict[int, _CostModel] = {}
        self.alpha = [0.0, 0.0]  # decayed (successes, trials)
        self.steps = 0
        self.last_k = initial

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 << max(0, batch - 1).bit_length()

    def acceptance(self) -> float:
        s, n = self.alpha
        return (s + 0.7) / (n + 1.0)  # weak prior at 0.7

    def best_length(self, batch: int) -> int:
        model = self.costs.get(self.bucket(batch))
        if model is None or not model.ready:
            return self.initial
        a, d = min(self.acceptance(), 0.999), model.draft_cost()
        scores = [((1 - a ** (k + 1)) / (1 - a)) / (k * d + model.verify_cost(k)) for k in range(self.max_length + 1)]
        return max(range(len(scores)), key=scores.__getitem__)

    def lengths(self, seq_ids):
        k = min(self.best_length(len(seq_ids)), self.last_k + 2)
        self.steps += 1
        if self.steps % self.probe_every == 0:
            k = 1 if k == 0 else min(self.max_length, k + 1) if (self.steps // self.probe_every) % 2 else k - 1
        self.last_k = k
        return [k] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        s, n = self.alpha[0] * self.decay, self.alpha[1] * self.decay
        for k, m in zip(proposed, accepted):
            if k:
                s += m
                n += m + (m < k)
        self.alpha = [s, n]

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s):
        self.costs.setdefault(self.bucket(batch), _CostModel(self.decay)).add(draft_forwards, draft_s, verify_k,
                                                                              verify_s)

    def forget(self, seq_id):
        pass


def make_policy(config: DraftLengthConfig) -> DraftLengthPolicy:
    if config.policy == "fixed":
        return FixedLength(config.fixed)
    if config.policy == "bass":
        return BassRule(config.initial, config.max_length)
    if config.policy == "auto":
        return MeasuredCost(min(config.initial, 4), config.max_length)
    return PerSequenceAdaptive(config.cost_ratio, config.max_length)
