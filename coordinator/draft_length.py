"""Draft-length policies: how many tokens the draft proposes for each sequence this step.

A policy sees, after every step, how many tokens each sequence was offered and accepted.
Length 0 means regular decoding for that sequence.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from bass.core.config import GRAPH_MAX_DRAFT, DraftLengthConfig


@dataclass(frozen=True)
class Join:
    """What speculating this step costs the draft before its proposal: the tokens it must run
    first (the prompts of sequences it does not hold yet, the tokens it skipped while they
    decoded regularly), and the tokens the batch's sequences may still decode (the median of
    their budgets: the most a join can pay back over)."""

    tokens: int
    horizon: int


JoinEstimate = Callable[[], Join]  # asked only where a draft length beats regular decoding


class DraftLengthPolicy(Protocol):
    def lengths(self, seq_ids: Sequence[int], join: JoinEstimate | None = None) -> list[int]: ...
    def observe(self, seq_ids: Sequence[int], proposed: Sequence[int], accepted: Sequence[int]) -> None:
        """accepted: per sequence, the tokens the target took before its own; more than
        proposed where it also took lookup tokens verified after the drafts ([target]
        lookup_tail): tokens a step of that length yielded, not the draft's acceptance."""
    def observe_costs(self, batch: int, draft_forwards: int, draft_s: float, verify_k: int,
                      verify_s: float | None, joined: int = 0) -> None:
        """Step times: draft_forwards = 0 or verify_s = None where that part is not a
        steady-state cost (prefill, catch-up); joined: the tokens the draft ran before this
        step's proposal (Join.tokens), in draft_s."""
    def forget(self, seq_id: int) -> None: ...


class _NoCosts:
    """For policies that do not look at step times."""

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        pass


class FixedLength(_NoCosts):
    def __init__(self, k: int):
        self.k = k

    def lengths(self, seq_ids, join=None):
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

    def lengths(self, seq_ids, join=None):
        return [self.length] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        offered = [(k, min(a, k)) for k, a in zip(proposed, accepted) if k > 0]
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


class _SequenceTrials:
    """Each sequence's decayed (successes, trials) of drafted tokens: accepting m of k counts m
    successes and, when m < k, one failure (the first rejected draft; those after it were not
    tested)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.stats: dict[int, tuple[float, float]] = {}  # seq_id -> (successes, trials)

    def get(self, seq_id: int) -> tuple[float, float]:
        return self.stats.get(seq_id, (0.0, 0.0))

    def add(self, seq_id: int, k: int, m: int) -> None:
        s, n = self.get(seq_id)
        self.stats[seq_id] = (s * self.decay + m, n * self.decay + m + (m < k))

    def forget(self, seq_id: int) -> None:
        self.stats.pop(seq_id, None)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.stats


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
        self.prior, self.prior_weight = prior, prior_weight
        self._trials = _SequenceTrials(decay)

    def acceptance(self, seq_id: int) -> float:
        s, n = self._trials.get(seq_id)
        return (s + self.prior * self.prior_weight) / (n + self.prior_weight)

    def best_length(self, a: float) -> int:
        a = min(a, 0.999)
        gains = [((1 - a ** (k + 1)) / (1 - a)) / (1 + self.cost_ratio * k) for k in range(self.max_length + 1)]
        return max(range(len(gains)), key=gains.__getitem__)

    def lengths(self, seq_ids, join=None):
        return [self.best_length(self.acceptance(i)) for i in seq_ids]

    def observe(self, seq_ids, proposed, accepted):
        for seq_id, k, m in zip(seq_ids, proposed, accepted):
            self._trials.add(seq_id, k, min(m, k))  # k = 0 too: the estimate drifts back to the prior

    def forget(self, seq_id):
        self._trials.forget(seq_id)


# Leaving regular decoding for a draft length whose cost is a line through other lengths needs
# at least this much more throughput. 15% is the single margin the policy used before
# 2026-11-25 (not tuned separately). At up to SHORTER_TRUSTED_MAX_BATCH sequences a length
# shorter than a timed one is held to the measured margin (`MeasuredCost._trusted`): its cost,
# the timed draft scaled down with verification kept, came within 1% of what fixed lengths
# measured on an H200 (2026-11-25 night 3, step traces: k = 2 from k = 3 at T = 0.8 and 1-8
# sequences in-process, 4.22-4.46 ms against 4.24-4.43; k = 3 from k = 4 through the services
# at 8, 4.58 against 4.57; k = 2 from k = 4 there 3.65 against 3.63 / 3.78), and its yield is
# the chain's (`_Yields`). There auto went
# from 2.01 to 1.85 ms a token at T = 0.8 and 2 sequences and from 1.87 to 1.81 greedy (k = 2:
# 1.78 / 1.65). With the bf16 draft that did not hold at more sequences (greedy 8: 1.94 against
# 1.88); with the int8 draft (cheaper shorter drafts), trusted at every batch size together with
# SEQUENCE_PRIOR_STEPS = 8, it did on an H200 (2026-11-26, both build orders, auto new / base):
# greedy 0.99 / 0.97 / 0.94 / 0.90 / 0.98 / 1.01 / 0.99 and T = 0.8 0.95 / 0.99 / 1.01 / 0.99 /
# 0.99 / 0.99 / 0.99 at 1 / 2 / 4 / 8 / 16 / 32 / 64 sequences (greedy 8: 1.92 -> 1.73, k = 2
# 1.65). On an H100 that pair sent auto at T = 0.8 and 8 sequences into k = 5 in 3 of 6
# processes (2.52-2.59 against regular decoding's 2.25-2.33), which SEQUENCE_PRIOR_STEPS = 4 never
# did (0 of 5, either value here); greedy at 2-8 moved 0.98-1.01 with either. So this is kept at
# every batch size and the pace prior at 4; that pair is measured on the H100 only.
EXTRAPOLATED_MARGIN = 0.15
# Where `auto` starts at a batch size it has not timed. Starting at k = 2 (the fastest fixed
# length on the H200 at 1-8 sequences) cost 1.5-3% at one sequence, where longer drafts win
# and are reached only by probes, and 3-5% at greedy 8 (2026-11-25 night 3).
AUTO_INITIAL_LENGTH = 4
# Steady steps of one draft length timed at a batch-size bucket before the first choice there.
MIN_TIMED_STEPS = 3
# A bucket whose regular step is not yet timed prices it by the nearest larger bucket's within
# a factor of 4 and of up to this many sequences, where that one is timed, instead of decoding
# regularly to time it: up to 16 sequences a regular step costs about the same at any batch
# (H200, 06ff26a: 1.44-1.49 ms at 1-4; H100, ca7633b: 1.70 at 1-8, 1.90 at 16), and a larger
# bucket's is never the cheaper, so the price leans, if at all, towards speculation where a
# smaller batch favours it anyway. A batch that shrinks comes from a larger bucket. Without
# it, each round of `bass bench speed` ended with its last sequence or two in a bucket of their
# own, decoding 4 regular steps for one timed sample (3 rounds to time it): on an H100's
# trace (2026-11-27-h100-readme-table-ab03515/auto-tail2-p4.json, 4 sequences) the last
# sequence's 4 regular steps before its last draft. On two H200s (2026-11-28-h200x2-lookup-tails,
# no trace) `auto` ran 1.22 ms a token at 4 sequences where fixed k = 4 ran 1.03, with 7-12
# regular steps a round and bucket 1's regular step timed 3 times.
SHARED_REGULAR_COST_MAX_BATCH = 16
# While speculating, the periodic k = 0 probe keeps regular decoding's measured cost current,
# which decides nothing unless the best length's lead over it (in scores) is thin: it is run
# only below this lead. It is not cheap: on an H100 (2026-11-27, services, greedy, 128-token
# rounds) each cost 7-9 ms of a 180-230 ms round (4 regular steps of ~1.9 ms, then a return to
# speculation without a chain at 7.4-8.6 ms against a steady k = 4's 4.7-5.1), with 1-3 a round
# most of why auto ran 4-7% behind fixed k = 3 at 1 and 8 sequences (1.466 / 1.414 and 1.829 /
# 1.708 ms/token), where k = 4 led regular decoding 1.6-1.8x per committed token.
ZERO_PROBE_LEAD = 0.25
# E(k) is the mean sequence's tokens per step, but a batch (and a request of n sequences) waits
# for its slowest: on an H100 (176f1c8, k = 4, 128 tokens each) 8 sequences at T = 0.8 took 45
# steps where their mean tokens per step (4.04) predicts 32, and 64 greedy ones 37 where 4.24
# predicts 30. So a batch's tokens per step are scaled by how far its slowest sequence falls
# behind the mean (MeasuredCost.batch_tail), judged from each sequence's own tokens per drafted
# step, drawn towards the batch's mean with the weight of this many steps (one sequence's few
# steps say little). The pace is judged in tokens per step, not from a per-token acceptance
# through the geometric model: acceptance runs are correlated, and the minimum of noisy
# per-token estimates put a batch of 8 (greedy, H100) at 0.77 of the mean's pace where fixed
# k = 4 realized 0.86, which hid a 5-8% gain of k = 3 over regular decoding
# (bench/policy/auto_batch_sim.py reproduces it: 0.80 believed, 0.89 realized). 8 was tried twice: alone
# no gain (H200, 2026-11-25 night 3); with shorter lengths trusted at every batch size a gain on
# an H200 and, on an H100, auto's worst T = 0.8 runs at 8 sequences (see EXTRAPOLATED_MARGIN).
SEQUENCE_PRIOR_STEPS = 4.0
# Where regular decoding is chosen but the best draft length scores within this fraction of it,
# that length is drafted for THIN_PROBE_STEPS steps in a row, THIN_FIRST_PROBE_AFTER steps after
# regular decoding was chosen and every THIN_PROBE_EVERY steps after: regular steps teach nothing
# of the pace that decided against speculation, and that pace is often a new batch's few steps
# (the slowest of 8 sequences' first steps reads low). Without it, on an H100 (ca7633b, services,
# T = 0.8, 8 sequences) auto decoded regularly at 2.23 ms a token where k = 3 ran 2.00, k = 4
# scoring 0.476 tokens/ms against regular decoding's 0.492. The policy replayed with that
# machine's costs (bench/policy/auto_batch_sim.py --costs h100-ca7633b --same-prompts;
# bench/results/2026-11-27-cpu-thin-probe-sim-aef59b6.txt) ended whole rounds regular in
# 40 / 23 / 77% of runs at 4 / 8 / 16 sequences, with these probes in 3 / 3 / 33%: T = 0.8
# 1.782 / 1.820 / 2.184 -> 1.721 / 1.773 / 2.138 ms a token (fixed k = 4 1.717 / 1.756 / 2.066),
# greedy 1.492 / 1.464 / 1.909 -> 1.446 / 1.448 / 1.855; unchanged at 1, 2 and 64 sequences,
# where one mode leads by far more. On the H100 (A/B at T = 0.8, both orders) level or better at
# 4 and 8 sequences by the rounds' means. A probe first makes the draft run every token it
# skipped (a join), and at 64 sequences on an H100 that outweighed all it could find: with a
# regular step priced right (PairedPeriods), k = 4 scored within the lead, a probe came every
# 24 steps, each after a join of ~1,500 tokens (~7 ms), and auto ran 3.28-3.44 ms a token where
# regular decoding ran 2.68-2.69 (bench/results/2026-11-28-h100-paired-prices). So a thin probe
# waits while its join costs more than the lead's share of THIN_PROBE_EVERY regular steps: at
# 8 sequences ~0.8 ms of join against ~3.8, at 64 ~7 against ~4.3 (the first probe after
# leaving speculation, after THIN_FIRST_PROBE_AFTER steps, still fits).
THIN_REGULAR_LEAD = 0.08
THIN_PROBE_STEPS = 4
THIN_PROBE_EVERY = 24
THIN_FIRST_PROBE_AFTER = 12  # regular steps after leaving speculation
# Sequences that have barely speculated (a new batch) take the pace their batch-size bucket
# showed before, in proportion to what they lack of SEQUENCE_PRIOR_STEPS drafted steps each;
# starting each batch from the mean sent auto into a few speculative steps per new batch where
# regular decoding was faster (H100, 24f414f: T = 0.8 batch 64 3.72 against regular 3.35 with 2
# such steps in 127). A bucket remembers its pace from this much evidence on (its sequences'
# second drafted step): a bucket that soon chose regular decoding otherwise kept none, and its
# next batches started at the mean's pace.
PACE_EVIDENCE = 0.5


class _CostModel:
    """Step costs at one batch-size bucket: the median of recent observations of a draft call's
    time and of the rest of the step ("verify": verification and the loop's own work), at each k (a median, so that an odd slow step does not
    steer the policy). At an unobserved k, a straight line through the observed ones: a draft
    call has a fixed part (its first forward runs the pending tokens, and the results are
    copied back once: ~0.5-0.9 ms on the H100) beside its per-token forwards, so with two or
    more lengths seen it is fitted, and with one it is taken as proportional to k;
    verification is flat while one k has been seen."""

    def __init__(self, window: int):
        self.window = window
        self.draft: dict[int, deque[float]] = {}  # k -> seconds per draft call
        self.verify: dict[int, deque[float]] = {}  # k -> verification seconds

    def add(self, draft_forwards: int, draft_s: float, k: int, verify_s: float | None) -> None:
        if draft_forwards:
            self.draft.setdefault(draft_forwards, deque(maxlen=self.window)).append(draft_s)
        if verify_s is not None:
            self.verify.setdefault(k, deque(maxlen=self.window)).append(verify_s)

    @property
    def ready(self) -> bool:
        """Enough steps timed to choose from: a few of one draft length (one step says little:
        the first steps after a start or a batch change run slower or faster by chance)."""
        return (any(len(d) >= MIN_TIMED_STEPS for d in self.draft.values())
                and any(len(v) >= MIN_TIMED_STEPS for k, v in self.verify.items() if k > 0))

    def measured(self, k: int) -> bool:
        """Whether a step of k drafts was timed here (rather than extrapolated)."""
        return k in self.verify and (k == 0 or k in self.draft)

    def draft_cost(self, k: int) -> float:
        return 0.0 if k == 0 else self._at(_medians(self.draft), k, proportional=True)

    def verify_cost(self, k: int) -> float:
        return self._at(_medians(self.verify), k, proportional=False)

    def step_costs(self, max_length: int) -> list[float]:
        """draft_cost(k) + verify_cost(k) for k = 0..max_length, each median taken once."""
        draft, verify = _medians(self.draft), _medians(self.verify)
        return [(0.0 if k == 0 else self._at(draft, k, proportional=True)) + self._at(verify, k, proportional=False)
                for k in range(max_length + 1)]

    @staticmethod
    def _at(medians: dict[int, float], k: int, proportional: bool) -> float:
        if k in medians:
            return medians[k]
        points = list(medians.items())
        if len(points) == 1:
            j, v = points[0]
            return max(1e-9, v * k / j) if proportional else v
        mean_k = sum(j for j, _ in points) / len(points)
        mean_v = sum(v for _, v in points) / len(points)
        var = sum((j - mean_k) ** 2 for j, _ in points)
        slope = max(0.0, sum((j - mean_k) * (v - mean_v) for j, v in points) / var)
        return max(1e-9, mean_v + slope * (k - mean_k))


def _medians(observed: dict[int, deque[float]]) -> dict[int, float]:
    return {k: statistics.median(v) for k, v in observed.items()}


def expected_tokens(a: float, k: int) -> float:
    """Tokens a sequence commits in a step of k drafts if each is accepted with probability a
    (the accepted run, plus the target's own token)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def _tail(gain_share: float, expected: float) -> float:
    """A batch's slowest sequence's tokens per step over the mean's at a length whose mean
    sequence commits `expected` tokens a step, where the slowest gains `gain_share` of the
    mean's tokens beyond the one every step commits (a length of one draft loses less to the
    tail than one of four); 1 where the slowest keeps all of it, or for regular decoding."""
    return (1 + gain_share * (expected - 1)) / expected


class _SequencePace:
    """Each sequence's decayed tokens per drafted step: (tokens, steps) decayed, and the steps
    it drafted (not decayed: the evidence a new batch's pace rests on)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.stats: dict[int, tuple[float, float, int]] = {}
        # gain_share's last answer, for the same sequences and no change since: `auto` asks it
        # before every step, and while it decodes regularly nothing changes (a pass over 64
        # sequences cost ~90 us of the host's ~2.2 ms step on the CPU that measured it).
        self._revision = 0
        self._last: tuple[int, tuple[int, ...], tuple[float, float]] | None = None

    def get(self, seq_id: int) -> tuple[float, float, int]:
        return self.stats.get(seq_id, (0.0, 0.0, 0))

    def add(self, seq_id: int, tokens: int) -> None:
        t, n, seen = self.get(seq_id)
        self.stats[seq_id] = (t * self.decay + tokens, n * self.decay + 1, seen + 1)
        self._revision += 1

    def forget(self, seq_id: int) -> None:
        self.stats.pop(seq_id, None)
        self._revision += 1

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.stats

    def gain_share(self, seq_ids: Sequence[int]) -> tuple[float, float]:
        """(the share of the batch's mean tokens per drafted step beyond the first that its
        slowest sequence gains, in [0, 1]; the evidence, in [0, 1]: the mean share of
        SEQUENCE_PRIOR_STEPS each sequence has drafted)."""
        key = tuple(seq_ids)
        if self._last is not None and self._last[0] == self._revision and self._last[1] == key:
            return self._last[2]
        answer = self._gain_share(seq_ids)
        self._last = (self._revision, key, answer)
        return answer

    def _gain_share(self, seq_ids: Sequence[int]) -> tuple[float, float]:
        stats = [self.get(seq_id) for seq_id in seq_ids]
        tokens, steps = sum(t for t, _, _ in stats), sum(n for _, n, _ in stats)
        evidence = statistics.fmean(min(1.0, seen / SEQUENCE_PRIOR_STEPS) for _, _, seen in stats)
        mean = tokens / steps if steps else 1.0
        if mean <= 1:  # nothing accepted: no gain to share
            return 1.0, evidence
        slowest = min((t + mean * SEQUENCE_PRIOR_STEPS) / (n + SEQUENCE_PRIOR_STEPS) for t, n, _ in stats)
        return min(1.0, max(0.0, (slowest - 1) / (mean - 1))), evidence


# A join (Join) must pay for itself within the batch's remaining budgets, at most this many of
# each sequence's tokens: leaving regular decoding, or speculating where the draft does not hold
# the batch yet, costs the draft's run over the tokens it lacks, which no step cost counts. On
# an H100 at batch 64 (b1a07b2, greedy, 128 new tokens) one such step of auto cost 51 ms, the
# draft's prefill of all 64 sequences (10k tokens), ~20 regular steps, for two drafted steps:
# auto 3.60 ms/token against regular 3.05. Budgets are upper bounds (a sequence may stop at
# its end-of-sequence token long before), hence the cap, twice the default budget.
JOIN_HORIZON_TOKENS = 256
# Joins of at least this many tokens time the draft's seconds per joined token. A smaller one's
# time is mostly a draft call's fixed part (and a first call's set-up: 43 ms at batch 1), which
# priced every token 30x too dear (H100, 10c2746: 240-360 us a token after the first requests,
# against 7-9 us from joins of whole batches of 64), and auto then decoded regularly at
# batches 2-8 where k = 3 ran 8-16% faster.
JOIN_TIMED_TOKENS = 1024

# Sequence-steps of one draft length before its measured tokens per step are used for it.
MIN_MEASURED_SEQUENCE_STEPS = 8
# Sequence-steps drafted at the initial length before regular decoding may be chosen over it.
# Regular steps teach nothing about acceptance, so a choice of regular decoding made on a few
# unlucky steps stands until the next probe (2,048 steps on): simulated at batch 1 with the
# H100's costs (bench/policy/auto_alone_sim.py, T = 0.8, k = 4 21% faster than regular decoding), 30%
# of 200 runs ended decoding regularly, some after 3 drafted steps; with this floor none, at
# ~0.16 ms/token more in the first request where speculation does not pay. At 8 sequences and
# more it is one or two steps.
MIN_EXPLORED_SEQUENCE_STEPS = 16
# ... and at most SMALL_BATCH sequences, where a step is one or two samples and the draft's joins
# are small (a prompt or two), this many: a completion's first tokens are drafted worse than the
# rest, and 16 of them made auto decode regularly at T = 0.8 and 2 sequences where k = 3 ran 15%
# faster (H100, d8e95ba). With 128 (11a5c5d, both build orders, one H100) auto ran 1.77 / 2.10
# greedy and 1.88 / 2.24 sampled at 1 / 2 sequences against 1.78 / 2.13 and 1.91 / 2.32 with 16.
# Not beyond: at 8-16 sequences the longer exploration paid draft joins and mode switches worth
# more than it found (greedy 16: 2.60 against 2.40), as bench/policy/auto_batch_sim.py also shows.
# Where speculation does not pay at all (a weak draft: auto_alone_sim.py --p0 0.6 --p1 0.7),
# 128 cost a lone sequence ~0.4-0.6 ms/token over its first ~300 tokens, once.
SMALL_BATCH = 2
# Where a length shorter than a timed one is held to the measured margin (EXTRAPOLATED_MARGIN):
# every batch size measured (1-64).
SHORTER_TRUSTED_MAX_BATCH = 64
MIN_EXPLORED_SEQUENCE_STEPS_SMALL_BATCH = 128
# The measured tokens per step remember at least this many sequence-steps (and 1 / (1 - decay)
# steps): at one sequence a step is one noisy sample (T = 0.8, k = 4: 1 to 5 tokens), and ten
# of them mislead.
YIELD_MEMORY_SEQUENCE_STEPS = 64


class _Yields:
    """Tokens per sequence-step measured at each draft length (decayed means), and a chain
    model for the lengths not measured.

    The geometric model with one per-token acceptance misjudges how many tokens a step of k
    drafts yields: acceptance is not the same from draft to draft (on an H100 at batch 1 the
    decayed estimate, 0.842, predicted 3.65 tokens a k = 4 step where fixed k = 4 committed
    ~4.1). So a measured length is scored by the tokens per step it measured.
    A length not measured follows a chain: the first draft accepted with probability p0, each
    further one, after an acceptance, with p1, both counted over every drafted step. The
    pair's first draft is accepted more often than the later ones (on an H200, fixed k = 2 / 3
    / 4 committed 2.70 / 3.41 / 4.02 tokens a step greedy, 2.72 / 3.42 at T = 0.8: p0 ~0.93, p1
    ~0.86), so the one acceptance that reproduces k = 4, carried to k = 2 (as before), underrates
    it: auto on that H200 at T = 0.8 and 2 sequences decoded regularly where k = 2 ran 12%
    faster.
    At one to four sequences the target also verifies lookup tokens after the drafts (a lookup
    tail, target_service/worker.py), which a sequence that accepted all k drafts may take too:
    a measured length's yield holds them, so the chain adds them as well, at the mean a
    sequence took after accepting all its drafts (P(all k accepted) = p0 p1^(k - 1)). Without
    them the chain underrated every length not measured against the one drafted (H200, T = 0.8,
    one sequence: k = 2 scored 2.7 tokens a step where it commits 3.5; auto drafted k = 4 at
    1.01 ms/token where k = 2 ran 0.92, bench/results 2026-11-28-h200-yield-tails). The tail
    a step may take shrinks as k grows (7 - k tokens at one sequence), so the mean taken at a
    longer k underrates a shorter one's: a guess on the safe side."""

    def __init__(self, decay: float):
        self.decay = decay
        self.sums: dict[int, tuple[float, float, int]] = {}  # k -> (tokens, sequence-steps) decayed, seen
        # decayed (first drafts accepted, first drafts tested, later drafts accepted, later tested)
        self.chain = [0.0, 0.0, 0.0, 0.0]
        # decayed (lookup tokens taken after the last draft, sequences that accepted all their drafts)
        self.tail = [0.0, 0.0]

    def add(self, k: int, accepted: Sequence[int]) -> None:
        """One step's sequences that drafted k tokens and accepted `accepted` of them (more than
        k where lookup tokens after the drafts were taken: they count in the tokens a step of k
        yields, not in the chain's draft-by-draft acceptance)."""
        t, n, seen = self.sums.get(k, (0.0, 0.0, 0))
        decay = max(self.decay, (1 - 1 / YIELD_MEMORY_SEQUENCE_STEPS) ** len(accepted))
        t, n, seen = t * decay + sum(accepted) + len(accepted), n * decay + len(accepted), seen + len(accepted)
        self.sums[k] = (t, n, seen)
        # Draft j + 1 (j >= 1) is tested where the first j were accepted: min(m, k - 1) of them,
        # m - 1 of those accepted where m >= 1.
        first_ok, first, later_ok, later = (x * decay for x in self.chain)
        taken, reached = (x * decay for x in self.tail)
        self.tail = [taken + sum(m - k for m in accepted if m >= k), reached + sum(m >= k for m in accepted)]
        accepted = [min(m, k) for m in accepted]
        self.chain = [first_ok + sum(m >= 1 for m in accepted), first + len(accepted),
                      later_ok + sum(max(0, m - 1) for m in accepted),
                      later + sum(min(m, k - 1) for m in accepted if m >= 1)]

    def seen(self, k: int) -> int:
        """Sequence-steps drafted at length k so far."""
        return self.sums.get(k, (0.0, 0.0, 0))[2]

    def measured(self, k: int) -> float | None:
        """Tokens per sequence-step measured at length k (None until it drafted
        MIN_MEASURED_SEQUENCE_STEPS sequence-steps)."""
        t, n, seen = self.sums.get(k, (0.0, 0.0, 0))
        return t / n if seen >= MIN_MEASURED_SEQUENCE_STEPS else None

    def chained_tokens(self, k: int) -> float | None:
        """Tokens a step of k drafts yields under the chain model, lookup tails included (None
        before any length was measured)."""
        if all(seen < MIN_MEASURED_SEQUENCE_STEPS for _, _, seen in self.sums.values()):
            return None
        first_ok, first, later_ok, later = self.chain
        p0 = first_ok / first
        p1 = min(0.999, (later_ok + 0.5) / (later + 1.0))  # a weak prior: k = 1 tests no later draft
        taken, reached = self.tail
        tail = taken / reached if reached else 0.0
        return 1 + p0 * (1 - p1 ** k) / (1 - p1) + p0 * p1 ** (k - 1) * tail


class MeasuredCost:
    """The batch-level draft length that maximizes measured throughput (our default).

    Tokens per step are those measured at k (per sequence-step, decayed); a length not measured
    follows a chain of a first and later acceptances counted over every drafted step (see
    `_Yields`); before any, E(k) = (1 - a^(k+1)) / (1 - a) at a decayed estimate a of the
    per-token acceptance.
    A step costs a draft call of k tokens plus the rest of the step (verification
    and the coordinator's own work around it, which regular decoding pays once per token), both
    timed as the coordinator sees them (RPC included; steps with prefill or draft catch-up are
    not counted) and modelled per batch-size bucket. It picks argmax_k E(k) / cost(k) over 1..max_length,
    and regular decoding (k = 0) unless that speculation beats it by `margin` (5%; at least 15%
    where the cost is extrapolated, not measured): speculating costs a draft catch-up each time
    it resumes. A batch's tokens per step are those of its slowest sequence, not of the mean
    one (`batch_tail`, judged from each sequence's tokens per drafted step; a new batch starts
    from the pace its batch size showed before). Once speculating, it stays while speculation
    is ahead at all (hysteresis: the two thresholds keep it from flapping, each flap being a
    catch-up); per
    batch-size bucket, since the tail of a batch (a few sequences left) can favour speculation
    where the full batch does not. k grows by at most 2 a step from the last length drafted
    (an estimate from one k says little about much longer drafts). While speculating, every `probe_every` steps it tries
    a neighbour of the best k, to keep costs and acceptance current, or, every fourth probe,
    k = 0 (regular decoding, for `regular_probe_steps` steps), but only where the best k's lead
    over regular decoding is under ZERO_PROBE_LEAD: elsewhere its cost decides nothing.
    While decoding regularly, a probe (k = 1) makes the draft catch up on every token it
    skipped, for every sequence (at batch 64 on an H100, auto choosing regular decoding but
    probing from step 16 on ran 10-20% slower than regular decoding; bench/results,
    2026-11-25), so the first comes after `regular_probe_every` steps and the next ones ever
    further apart, up to `max_probe_every`. Acceptance learnt
    while speculating at other batch sizes still moves the choice between probes. Since
    regular steps teach nothing about acceptance, regular decoding is not chosen before
    MIN_EXPLORED_SEQUENCE_STEPS sequence-steps have drafted at the initial length
    (MIN_EXPLORED_SEQUENCE_STEPS_SMALL_BATCH at up to SMALL_BATCH sequences). Where the
    draft would first have to run tokens it lacks (a `Join`: a new batch, a return from regular
    decoding), a length must also pay that back: the time it saves over regular decoding on
    the batch's remaining budgets (the median; at most JOIN_HORIZON_TOKENS tokens) must exceed
    the join's, at the draft's seconds per joined token measured on large joins.
    """

    def __init__(self, initial: int = AUTO_INITIAL_LENGTH, max_length: int = 8, decay: float = 0.9,
                 probe_every: int = 16, regular_probe_every: int = 2048, max_probe_every: int = 16384, window: int = 16,
                 margin: float = 0.05, regular_steps_in_flight: int = 1):
        self.initial, self.max_length, self.decay = initial, max_length, decay
        # A regular step is timed only when sent behind another and committed behind the next,
        # and priced by two such steps in a row (Scheduler._commit_regular, PairedPeriods): with
        # n steps kept in flight, the first of a run and the n committed as speculation resumes
        # are not timed, so a k = 0 probe is n + 3 regular steps.
        self.regular_probe_steps = regular_steps_in_flight + 3
        self.probe_every, self.max_probe_every, self.window = probe_every, max_probe_every, window
        self.regular_probe_every = regular_probe_every
        self.margin = margin
        self.costs: dict[int, _CostModel] = {}
        self.alpha = [0.0, 0.0]  # decayed (successes, trials): used until a length is measured
        self.pace = _SequencePace(decay)
        # bucket -> decayed mean of the share of the mean's gain its slowest sequence kept
        # (_SequencePace.gain_share), taken from PACE_EVIDENCE on
        self.gain_shares: dict[int, float] = {}
        self.yields = _Yields(decay)
        self.steps = 0
        # The last length drafted: k grows from it, so a k = 0 probe is not followed by a climb
        # (through the services at batch 16-64 on an H100, 0, 0, 0, 2, 3, 4: each short step
        # cost a full step's time, and a change of length is one more step without a chain).
        self.last_drafted = initial
        self.speculating: bool | None = None  # the mode last chosen, probes aside (None: not yet)
        # The mode chosen at each batch-size bucket: leaving it needs that bucket's evidence
        # (a choice made with a few sequences left says nothing about a full batch).
        self.chosen: dict[int, bool] = {}
        self.zero_probe_every, self.next_zero_probe = regular_probe_every, regular_probe_every
        # While regular decoding leads by less than THIN_REGULAR_LEAD: the next probe of the
        # best length, its steps left, and the length.
        self.next_thin_probe, self.thin_probe_left, self.thin_probe_k = THIN_FIRST_PROBE_AFTER, 0, 0
        self.thin_probes = 0  # how many were started (describe)
        self.last_choice_drafted = False  # whether the last best_length was a draft length
        self.regular_probe_left = 0  # further regular steps of a k = 0 probe
        # The scores best_length computed last (None before its bucket was ready): lengths()
        # weighs a k = 0 probe on them rather than pass over the batch again.
        self.last_scores: list[float] | None = None
        self.joins = [0.0, 0.0]  # decayed (seconds, tokens) the draft spent on joins

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 << max(0, batch - 1).bit_length()

    def acceptance(self) -> float:
        s, n = self.alpha
        return (s + 0.7) / (n + 1.0)  # weak prior at 0.7

    def scores(self, batch: int, seq_ids: Sequence[int] = ()) -> list[float] | None:
        """Expected tokens per second at k = 0..max_length for a batch of `batch` sequences
        (those of seq_ids, when given: their slowest sets the pace); None before this bucket's
        costs are known."""
        model = self.costs.get(self.bucket(batch))
        if model is None or not model.ready:
            return None
        # Asked before every step, so each input is read once, not once per length: the batch's
        # pace (a pass over its sequences) and each timed length's median cost.
        share = self.gain_share(seq_ids)
        costs = model.step_costs(self.max_length)
        if len(model.verify.get(0, ())) < MIN_TIMED_STEPS:
            costs[0] = self._shared_regular_cost(self.bucket(batch)) or costs[0]
        scores = []
        for k, cost in enumerate(costs):
            expected = self.tokens_per_step(k)
            scores.append(expected * _tail(share, expected) / cost)
        return scores

    def _shared_regular_cost(self, bucket: int) -> float | None:
        """A regular step's median cost timed at the nearest larger bucket within a factor of 4
        and of up to SHARED_REGULAR_COST_MAX_BATCH sequences; None where there is none."""
        timed = [b for b, m in self.costs.items()
                 if bucket < b <= min(4 * bucket, SHARED_REGULAR_COST_MAX_BATCH)
                 and len(m.verify.get(0, ())) >= MIN_TIMED_STEPS]
        return statistics.median(self.costs[min(timed)].verify[0]) if timed else None

    def batch_tail(self, seq_ids: Sequence[int], k: int) -> float:
        """The slowest sequence's expected tokens per step of k drafts over the mean sequence's
        (<= 1): see `gain_share`. 1 for k = 0 (every sequence commits one token) and for a
        lone sequence."""
        return _tail(self.gain_share(seq_ids), self.tokens_per_step(k))

    def gain_share(self, seq_ids: Sequence[int]) -> float:
        """The share of the mean sequence's tokens per drafted step beyond the first that the
        batch's slowest sequence gains, each sequence's own pace drawn towards the mean with
        SEQUENCE_PRIOR_STEPS' weight. Where the sequences have drafted fewer steps than that (a
        new batch), the share this bucket showed before makes up for the evidence they lack.
        1 for a lone sequence (no batch to wait for)."""
        if len(seq_ids) < 2:
            return 1.0
        share, evidence = self.pace.gain_share(seq_ids)
        remembered = self.gain_shares.get(self.bucket(len(seq_ids)))
        if remembered is not None and evidence < 1:
            share = evidence * share + (1 - evidence) * remembered
        return share

    def tokens_per_step(self, k: int) -> float:
        """Expected tokens a sequence commits in a step of k drafts (as scored): what k
        measured, else the chain model's (see _Yields), else the decayed acceptance's."""
        if k == 0:
            return 1.0
        measured = self.yields.measured(k)
        if measured is not None:
            return measured
        chained = self.yields.chained_tokens(k)
        return expected_tokens(min(self.acceptance(), 0.999), k) if chained is None else chained

    def join_seconds_per_token(self) -> float | None:
        """The draft's measured time per joined token (None before a join was timed)."""
        seconds, tokens = self.joins
        return seconds / tokens if tokens else None

    def best_length(self, batch: int, seq_ids: Sequence[int] = (), join: JoinEstimate | None = None) -> int:
        scores = self.last_scores = self.scores(batch, seq_ids)
        if scores is None:  # a batch size not measured yet: drafts of `initial` measure it, unless
            return 0 if self.speculating is False else self.initial  # regular decoding was chosen
        # Speculation must win by the margin to be chosen (first, or over regular decoding), by
        # a wider one where its cost is extrapolated from other lengths; while speculating at
        # this batch size, it stays while ahead.
        model = self.costs[self.bucket(batch)]
        speculating = self.chosen.get(self.bucket(batch), False)

        def needed(k: int) -> float:
            if speculating:
                return 1.0
            return 1 + (self.margin if self._trusted(model, k, batch) else max(self.margin, EXTRAPOLATED_MARGIN))

        winners = [k for k in range(1, len(scores)) if scores[k] > needed(k) * scores[0]]
        if winners and join is not None:
            winners = self._paying_back(winners, scores, join())
        if not winners:
            return 0
        best = max(winners, key=scores.__getitem__)
        timed = [k for k in [0] + winners if model.measured(k)]
        if not self._trusted(model, best, batch) and timed:
            # A length whose cost is a line through others must beat the best timed choice
            # (regular decoding included) by the extrapolation margin, also while speculating:
            # else the policy wanders to other lengths on a guess (H100 greedy batch 1: drafts of
            # up to 8 while k = 4 was timed, 1.93 ms against k = 4's 1.70). The neighbour probes
            # still time k + 1 and k - 1, so better lengths are found by measurement.
            best_timed = max(timed, key=scores.__getitem__)
            if scores[best] < (1 + EXTRAPOLATED_MARGIN) * scores[best_timed]:
                return best_timed
        return best

    @staticmethod
    def _trusted(model: "_CostModel", k: int, batch: int) -> bool:
        """Whether k is held to the measured margin: timed, or, at up to SHORTER_TRUSTED_MAX_BATCH
        sequences, shorter than a timed draft length (see EXTRAPOLATED_MARGIN)."""
        return model.measured(k) or (batch <= SHORTER_TRUSTED_MAX_BATCH
                                     and any(j > k and model.measured(j) for j in model.draft))

    def _thin_probe_due(self, scores: list[float] | None, join: JoinEstimate | None) -> bool:
        """Whether a thin probe starts now (see THIN_REGULAR_LEAD). One whose join is too dear is
        put off THIN_PROBE_EVERY steps: while the batch decodes regularly its join only grows, and
        pricing it (a pass over the batch) before every step would buy nothing."""
        if (scores is None or self.steps < self.next_thin_probe
                or max(scores[1:]) < (1 - THIN_REGULAR_LEAD) * scores[0]):
            return False
        if self._thin_probe_affordable(scores, join):
            return True
        self.next_thin_probe = self.steps + THIN_PROBE_EVERY
        return False

    def _thin_probe_affordable(self, scores: list[float], join: JoinEstimate | None) -> bool:
        """Whether a thin probe's join (the draft catching up on the tokens it skipped) costs
        at most what the probe could win back before the next one: THIN_REGULAR_LEAD of
        THIN_PROBE_EVERY regular steps (see THIN_REGULAR_LEAD)."""
        rate = self.join_seconds_per_token()
        if rate is None or join is None:
            return True
        return join().tokens * rate <= THIN_REGULAR_LEAD * THIN_PROBE_EVERY / scores[0]

    def _paying_back(self, winners: list[int], scores: list[float], join: Join) -> list[int]:
        """The lengths whose time saved over regular decoding, over the join's horizon, exceeds
        the join's own time."""
        rate = self.join_seconds_per_token()
        if rate is None or not join.tokens:
            return winners
        join_s, horizon = join.tokens * rate, min(join.horizon, JOIN_HORIZON_TOKENS)
        return [k for k in winners if horizon * (1 / scores[0] - 1 / scores[k]) > join_s]

    def lengths(self, seq_ids, join=None):
        self.steps += 1
        bucket = self.bucket(len(seq_ids))
        model = self.costs.get(bucket)
        if (model is not None and model.ready and len(model.verify.get(0, ())) < MIN_TIMED_STEPS
                and self._shared_regular_cost(bucket) is None):
            # Measure regular decoding at this batch size before choosing: a line through
            # k >= 1 misjudges it (below), and the draft skips only a few tokens. Only a
            # regular step sent behind another and committed behind the next is timed, and priced
            # with the one before it (Scheduler._commit_regular), so this takes MIN_TIMED_STEPS +
            # regular_probe_steps - 1. Not where a larger bucket's regular step prices it
            # (SHARED_REGULAR_COST_MAX_BATCH).
            return [0] * len(seq_ids)
        best = self.best_length(len(seq_ids), seq_ids, join)
        floor = MIN_EXPLORED_SEQUENCE_STEPS_SMALL_BATCH if len(seq_ids) <= SMALL_BATCH else MIN_EXPLORED_SEQUENCE_STEPS
        if best == 0 and model is not None and model.ready and self.yields.seen(self.initial) < floor:
            best = self.initial  # too few drafted steps to give speculation up on
        if model is not None and model.ready:
            self.speculating = self.chosen[self.bucket(len(seq_ids))] = best > 0
        k = min(best, self.last_drafted + 2)
        self.last_choice_drafted, was_drafting = best > 0, self.last_choice_drafted
        if best == 0:
            self.regular_probe_left = 0
            scores = self.last_scores
            if was_drafting:  # just left speculation: the first probe comes a while on
                self.next_thin_probe = self.steps + THIN_FIRST_PROBE_AFTER
            if self.thin_probe_left:
                self.thin_probe_left -= 1
                k = self.thin_probe_k
            elif self._thin_probe_due(scores, join):
                # Regular decoding leads by a hair: the batch's pace that decided it may be a
                # few unlucky steps, and regular steps never correct it. Draft the best length
                # for a few steps, so that its yield and the sequences' paces are measured again.
                self.thin_probe_k = 1 + max(range(len(scores) - 1), key=lambda j: scores[j + 1])
                self.thin_probe_left, k = THIN_PROBE_STEPS - 1, self.thin_probe_k
                self.thin_probes += 1
                self.next_thin_probe = self.steps + THIN_PROBE_EVERY
            elif self.steps >= self.next_zero_probe:
                k = 1
                self.zero_probe_every = min(2 * self.zero_probe_every, self.max_probe_every)
                self.next_zero_probe = self.steps + self.zero_probe_every
        else:
            self.thin_probe_left = 0
            self.zero_probe_every = self.regular_probe_every
            self.next_zero_probe = self.steps + self.regular_probe_every
            if self.steps % self.probe_every == 0:
                # Probes cycle: none, longer, shorter, longer. The k = 0 probe comes first: it
                # measures regular decoding itself, which a line through k >= 1 misjudges (at
                # batch 64 on an H100, verifying 5 tokens per sequence took 12.6 ms and 1 token
                # 5.3 ms, not the flat 12.6 that one observed k extrapolates to). Where the lead
                # is wide it is skipped (ZERO_PROBE_LEAD): should it shrink, the probes resume.
                phase = (self.steps // self.probe_every - 1) % 4
                if phase == 0:
                    scores = self.last_scores
                    if scores is None or scores[best] < (1 + ZERO_PROBE_LEAD) * scores[0]:
                        k = 0
                else:
                    k = max(1, k - 1) if phase == 2 else min(self.max_length, k + 1)
                self.regular_probe_left = self.regular_probe_steps - 1 if k == 0 else 0
            elif self.regular_probe_left:
                self.regular_probe_left -= 1
                k = 0
        if k:
            self.last_drafted = k
        return [k] * len(seq_ids)

    def observe(self, seq_ids, proposed, accepted):
        if not any(proposed):
            # A regular step says nothing of acceptance: decaying here would forget it within a
            # few dozen regular steps and leave only the prior (0.7), so that the choice between
            # regular decoding and speculation would be made on the prior (H100 greedy batch 1:
            # regular chosen at 2.23 ms/token where k = 4 ran 1.99, acceptance then read 0.7).
            return
        s, n = self.alpha[0] * self.decay, self.alpha[1] * self.decay
        by_length: dict[int, list[int]] = {}
        for seq_id, k, m in zip(seq_ids, proposed, accepted):
            if k:
                s += min(m, k)  # the draft's acceptance; a step's yield and pace count every token
                n += min(m, k) + (m < k)
                by_length.setdefault(k, []).append(m)
                self.pace.add(seq_id, m + 1)
        self.alpha = [s, n]
        for k, accepted_runs in by_length.items():
            self.yields.add(k, accepted_runs)
        drafted = [seq_id for seq_id, k in zip(seq_ids, proposed) if k]
        if len(drafted) >= 2:
            share, evidence = self.pace.gain_share(drafted)
            if evidence >= PACE_EVIDENCE:
                bucket = self.bucket(len(drafted))
                old = self.gain_shares.get(bucket)
                self.gain_shares[bucket] = share if old is None else old * self.decay + share * (1 - self.decay)

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        model = self.costs.setdefault(self.bucket(batch), _CostModel(self.window))
        if joined >= JOIN_TIMED_TOKENS and draft_s > 0:
            # The join's part of the draft call: beyond a steady call of this length where one
            # was timed here, else all of it (a first join: over- rather than underestimated).
            steady = model.draft_cost(verify_k) if model.draft else 0.0
            self.joins = [self.joins[0] * self.decay + max(0.0, draft_s - steady),
                          self.joins[1] * self.decay + joined]
        model.add(draft_forwards, draft_s, verify_k, verify_s)

    def forget(self, seq_id):
        self.pace.forget(seq_id)

    def describe(self) -> dict:
        """What the policy knows (for benchmarks and logs): per batch-size bucket, the median
        timed cost of each draft length (ms), how many steps timed it, and the mode chosen;
        the acceptance estimate; the tokens per sequence-step measured at each draft length
        (decayed mean, sequence-steps seen); per bucket, the share of the mean's gain per drafted
        step that the slowest sequence kept (decayed); the draft's time per joined token (µs);
        how many probes drafted while regular decoding led by a hair (THIN_REGULAR_LEAD)."""
        def ms(samples) -> list:
            return [round(1000 * statistics.median(samples), 3), len(samples)]

        return {"acceptance": round(self.acceptance(), 4), "chosen": dict(self.chosen),
                "tokens_per_step": {k: [round(t / n, 3), seen] for k, (t, n, seen) in sorted(self.yields.sums.items())},
                "buckets": {bucket: {"draft": {k: ms(v) for k, v in sorted(m.draft.items())},
                                     "verify": {k: ms(v) for k, v in sorted(m.verify.items())}}
                            for bucket, m in sorted(self.costs.items())},
                "slowest_gain_share": {bucket: round(v, 3) for bucket, v in sorted(self.gain_shares.items())},
                "join_us_per_token": None if self.join_seconds_per_token() is None
                else round(1e6 * self.join_seconds_per_token(), 3),
                "thin_probes": self.thin_probes}


def make_policy(config: DraftLengthConfig, regular_steps_in_flight: int = 1) -> DraftLengthPolicy:
    """regular_steps_in_flight: how many regular steps the scheduler keeps in flight after a
    commit (coordinator/regular_pipeline.py), which decides how long a k = 0 probe must run for one of
    its steps to be timed."""
    if config.policy == "fixed":
        return FixedLength(config.fixed)
    if config.policy == "bass":
        return BassRule(config.initial, config.max_length)
    if config.policy == "auto":
        return MeasuredCost(min(config.initial, AUTO_INITIAL_LENGTH), min(config.max_length, GRAPH_MAX_DRAFT),
                            margin=config.speculation_margin, regular_steps_in_flight=regular_steps_in_flight)
    return PerSequenceAdaptive(config.cost_ratio, config.max_length)
