"""Why `auto` decodes regularly at 4-8 sequences where k = 3-4 is faster: the policy alone, simulated.

No models: each step's cost is the H100's, per batch-size bucket (bench/results, "2026-11-25
(night)": fixed k = 3 / 4 and policy 0 traces; a draft call of k tokens, its verification, a
regular step), and each sequence accepts along a chain whose first draft is accepted with the
sequence's own probability P0 (drawn uniformly from --p0) and each further one, after an
acceptance, with P1. As `bass bench speed` does, rounds of 128 tokens a sequence, a new batch
each (finished sequences leave it), one policy throughout, after a warm-up round of 16. For
each batch size it prints fixed k = 0 / 2 / 3 / 4 and `auto` (mean ms per token per sequence over
--runs runs, and the share of runs whose measured rounds ended no faster than regular
decoding), then what the policy believed of the last batch: its slowest sequence's expected
tokens per step of k = 4 over the mean's (`batch_tail`, for a new batch) against the pace fixed
k = 4's batches realized.

    python bench/policy/auto_batch_sim.py                          # greedy, P0 0.88-0.97, P1 0.86

The default chain is what fixed lengths committed on an H200 (2026-11-25 night 3, HumanEval
0:16): 2.70 / 3.41 / 4.02 tokens a step at k = 2 / 3 / 4, greedy, and 2.72 / 3.42 at T = 0.8,
which a first draft accepted at ~0.93 and each further one at ~0.86 reproduce. (Earlier runs of
this simulation assumed P0 0.75-0.95 and P1 0.95: later drafts accepted more often than the
first, the opposite of what the pair does.)
    python bench/policy/auto_batch_sim.py --mode sampled --runs 40

Each new batch also costs the draft a join, as the scheduler reports it (`Scheduler._join`):
where a step drafts, the draft first runs the prompts of sequences it does not hold and the
tokens it skipped while the batch decoded regularly, at the H100's measured ~7 us a token. With
--early-tokens N --early-drop D, a sequence's first N tokens are drafted worse (P0 - D): on
the H100 auto judged k = 4 from a completion's first tokens (3.76 tokens a step at greedy 8
against 4.0-4.3 over whole runs). --explore sets MIN_EXPLORED_SEQUENCE_STEPS, to compare floors.

    python bench/policy/auto_batch_sim.py --batches 4 8 16 --early-tokens 24 --early-drop 0.2 --explore 128

--rounds-trace N prints, for auto's first N runs at each batch size, the draft length of every
step, round by round (`|` between rounds; the first is the warm-up): whether auto settles, keeps
speculating, or starts each new batch speculating and falls back to regular decoding (what it
did through the services at 8 sequences on the H100, bench/results "2026-11-25 (night 2)").

    python bench/policy/auto_batch_sim.py --batches 8 --rounds 5 --rounds-trace 8

--same-prompts runs every round on the same batch again, as `bass bench speed` does (each
position keeps its P0 and replays its acceptance draws). Known gap (2026-11-25 night 3): at 4-8
sequences the H200's auto remembered a slowest-sequence share of 0.78-0.84 (0.78-0.81 at
greedy 8) where this simulation
believes ~0.92, so it keeps drafting k = 2 where the GPU fell back to regular decoding. Why is
open: the H200's tokens per step at 8 sequences vary from step to step as 8 independent chains
would (no bursts at the batch level); per-sequence traces would tell the spread between
sequences and within one.

--tail-p P models the lookup tails the target verifies after fully accepted drafts (6 at one or
two sequences, 2 at three or four, none above; each token kept with probability P after the one
before), which make a step's yield depend on the batch size:

    python bench/policy/auto_batch_sim.py --costs h200-06ff26a --batches 1 2 4 --tail-p 0.7

--set NAME=VALUE changes one of draft_length's constants for the run and --policy-arg NAME=VALUE
one of MeasuredCost's arguments, to weigh a candidate before measuring it on the GPU:

    python bench/policy/auto_batch_sim.py --batches 1 2 4 8 16 32 64 --set SEQUENCE_PRIOR_STEPS=8
    python bench/policy/auto_batch_sim.py --batches 8 --policy-arg initial=3
"""

from __future__ import annotations

import argparse
import random
import statistics

from auto_alone_sim import accepted  # the same acceptance chain as the batch-1 simulation
import bass.coordinator.draft_length as draft_length
from bass.coordinator.draft_length import Join, MeasuredCost

# Per bucket: (draft ms per token, draft call's fixed ms, verification ms at k > 0, regular step ms).
# "h100-2026-11-25": 16 and 64 from the late session's policy states (bench/results, "2026-11-25
# (late)"); "h100-ca7633b": `auto`'s policy states in the README-table run at ca7633b
# (bench/results/2026-11-27-h100-readme-table-ca7633b, through the services), buckets it did not
# time interpolated.
COST_SETS = {
    "h100-2026-11-25": {
        "greedy": {1: (1.08, 0.09, 2.08, 2.0), 2: (1.06, 0.09, 2.08, 2.01), 4: (1.07, 0.09, 2.1, 2.03),
                   8: (1.08, 0.08, 2.2, 2.05), 16: (1.1, 0.1, 2.28, 2.09), 64: (1.25, 0.1, 3.7, 2.25)},
        "sampled": {1: (1.19, 0.05, 2.23, 2.13), 2: (1.19, 0.05, 2.24, 2.17), 4: (1.2, 0.05, 2.3, 2.2),
                    8: (1.23, 0.1, 2.45, 2.22), 16: (1.27, 0.1, 2.95, 2.28), 64: (1.6, 0.1, 5.3, 2.72)}},
    "h100-ca7633b": {
        "greedy": {1: (0.6, 0.2, 1.77, 1.70), 2: (0.62, 0.2, 2.08, 1.70), 4: (0.66, 0.2, 2.34, 1.70),
                   8: (0.66, 0.23, 2.12, 1.71), 16: (0.75, 0.3, 2.8, 1.9), 64: (1.1, 0.4, 5.08, 2.23)},
        "sampled": {1: (0.62, 0.55, 2.0, 1.86), 2: (0.62, 0.55, 2.4, 1.86), 4: (0.66, 0.6, 2.94, 1.94),
                    8: (0.68, 0.6, 2.86, 2.03), 16: (0.8, 0.6, 3.3, 2.2), 64: (1.4, 0.55, 5.54, 2.58)}},
    # "h200-06ff26a": `auto`'s policy states at 1, 2 and 4 sequences, greedy, through the services
    # (bench/results/2026-11-28-h200x2-lookup-tails/m2-speed-greedy-tail6-r*.json: draft calls of
    # k = 3 / 4 / 5 0.62 ms a token apart), larger buckets left at 4's. Greedy only.
    "h200-06ff26a": {
        "greedy": {1: (0.62, 0.16, 1.54, 1.44), 2: (0.62, 0.17, 1.68, 1.46), 4: (0.62, 0.18, 1.70, 1.48)}},
    # "h200-631028b": `auto`'s policy states at 1, 2 and 4 sequences through the services, both
    # modes, steps sent ahead (bench/results/2026-11-28-h200-yield-tails/speed-*-base.json: draft
    # calls fitted over k = 1-5, the rest of the step at k = 3-4, regular steps at k = 0); larger
    # buckets left at 4's. With --min-step-ms 2.85: a speculative step no shorter than the host's
    # loop allows (k = 1's steps there: 0.82 ms of draft and 1.94-2.14 of the rest).
    "h200-631028b": {
        "greedy": {1: (0.617, 0.03, 1.53, 1.46), 2: (0.62, 0.17, 1.61, 1.45), 4: (0.62, 0.17, 1.61, 1.40)},
        "sampled": {1: (0.625, 0.04, 1.56, 1.50), 2: (0.622, 0.19, 1.65, 1.53), 4: (0.63, 0.19, 1.65, 1.51)}},
    # "h200-17677a1": `auto`'s policy states in the README table's first processes at 17677a1
    # (bench/results/2026-11-29-h200-final-table/m1-readme-*.json, steps sent ahead): draft calls
    # fitted over the lengths each bucket timed, verification at k = 3-5, regular steps where a
    # bucket timed them (greedy 2 and 4, T = 0.8 2 and 4: between 1's and 8's).
    "h200-17677a1": {
        "greedy": {1: (0.614, 0.03, 1.55, 1.47), 2: (0.615, 0.1, 1.55, 1.5), 4: (0.62, 0.2, 1.6, 1.52),
                   8: (0.616, 0.2, 1.71, 1.555)},
        "sampled": {1: (0.585, 0.19, 1.55, 1.419), 2: (0.635, 0.15, 1.69, 1.5), 4: (0.626, 0.215, 1.69, 1.55),
                    8: (0.645, 0.175, 1.76, 1.621)}},
}
COSTS = dict(COST_SETS["h100-2026-11-25"])  # --costs picks another
TOKENS = 128
WARM_UP_TOKENS = 16  # as `bass bench speed` for a fixed length (`auto` warms up on a whole round since 4684e34)
# --tail-p P: after a sequence accepts all k drafts, the target verifies lookup tokens continuing
# its own text (target_service/worker.py, `lookup_tail`: as many as `lookup_tail_length` gives),
# each accepted, after the one before, with probability P. 0: no tails (the simulation before
# 2026-11-28).
TAIL_P = [0.0]
# A speculative step whose length differs from the step before (a return from regular decoding,
# a probe of another length) runs without a chained proposal: its draft call and round trip are
# not hidden. On the H100 at ca7633b (T = 0.8, 8 sequences) such steps read ~1.4 ms over a steady
# step of their length (k = 3: 7.3 ms against fixed k = 3's 5.9). --unchained-ms sets it (0: none,
# the simulation before 2026-11-27 night); the scheduler times such steps for the policy no more.
UNCHAINED_MS = [0.0]
# --min-step-ms: the least a speculative step costs, whatever its draft and verification (the
# coordinator's and the workers' host loop; 0: none, the simulation before 2026-11-29).
MIN_STEP_MS = [0.0]
TIME_UNSTEADY = [False]  # --time-unsteady: give the policy unchained steps' times too (before 0c62e3b)
# --sent-ahead: steps sent ahead over a co-located pair (coordinator/speculative_ahead.py, since
# 1d501b2). A step is chained behind the last verification whatever its length, unless the step
# before decoded regularly; it is sent ahead where the step before was chained too. The first
# drafted step after regular decoding pays UNCHAINED_MS, the next (chained, not sent ahead: its
# call waits for the answer before it) --not-sent-ms. The policy is given the times of the steps
# the scheduler's rule takes: "length" (k the same as the step before's: main until 2026-11-29)
# or "sent" (steps sent ahead only: a candidate rule, journal 2026-11-28-h200-yield-tails).
SENT_AHEAD = [""]
NOT_SENT_MS = [0.0]
PROMPT_TOKENS = 94  # HumanEval 0:16's prompts as `bass bench speed` sends them (no template): 53-137, mean 94
JOIN_S_PER_TOKEN = 7e-6  # the draft's time per joined token on the H100 (5.6-8.6 us measured)
STEADY_PENDING = 2  # as Scheduler._join_tokens: tokens a drafted step runs anyway
POLICY_ARGS: dict = {}  # MeasuredCost's arguments (--policy-arg)
SAME_PROMPTS = [False]  # --same-prompts


def lookup_tail_length(batch: int, k: int) -> int:
    """Lookup tokens the target verifies after k drafts at this batch size, with the defaults
    (lookup_tail 6, graph_max_draft 8; engine/draft_loop.max_lookup_tail: 6 at one or two
    sequences, 2 at three or four, none above; one sequence's verification within 8 rows)."""
    m = min(6, 8 - k, 6 if batch <= 2 else 2 if batch <= 4 else 0)
    return max(0, min(m, 7 - k) if batch == 1 else m)


def step_cost(mode: str, batch: int, k: int, rng: random.Random) -> tuple[float, float]:
    """(draft seconds, rest of the step's seconds), with +-3% noise."""
    bucket = MeasuredCost.bucket(batch)
    per_token, fixed, verify, regular = COSTS[mode][max(b for b in COSTS[mode] if b <= bucket)]
    noise = rng.uniform(0.97, 1.03)
    if k == 0:
        return 0.0, regular * noise / 1000
    draft = fixed + per_token * k
    return draft * noise / 1000, max(verify, MIN_STEP_MS[0] - draft) * noise / 1000


def one_run(seed: int, batch: int, mode: str, p0: tuple[float, float], p1: float, rounds: int,
            fixed_k: int | None = None, early: tuple[int, float] = (0, 0.0),
            trace: list[list[int]] | None = None) -> tuple[float, MeasuredCost | None, float]:
    """(median ms per token per sequence of the measured rounds, the policy, the last batch's
    realized pace: its slowest sequence's tokens per drafted step over the mean's). trace: a
    list given gets each round's draft lengths, step by step. With SAME_PROMPTS, every round is
    the same batch again, as `bass bench speed` runs it (the first `batch` prompts each round):
    each position keeps its P0 and replays its acceptance draws from the same seed."""
    rng = random.Random(seed)
    prompts = random.Random(seed + 10_000)
    same_p0 = [prompts.uniform(*p0) for _ in range(batch)]
    policy = MeasuredCost(**POLICY_ARGS) if fixed_k is None else None
    per_round, next_id, realized = [], 0, 1.0
    early_tokens, early_drop = early
    for round_ in range(rounds + 1):
        tokens = WARM_UP_TOKENS if round_ == 0 and policy is None else TOKENS
        seqs = list(range(next_id, next_id + batch))
        next_id += batch
        if SAME_PROMPTS[0]:
            first = dict(zip(seqs, same_p0))
            draws = {s: random.Random(seed * 1000 + i) for i, s in enumerate(seqs)}
        else:
            first = {s: rng.uniform(*p0) for s in seqs}
            draws = dict.fromkeys(seqs, rng)
        done, drafted, seconds = dict.fromkeys(seqs, 0), dict.fromkeys(seqs, [0, 0]), 0.0
        held, skipped, drafted_last = dict.fromkeys(seqs, False), dict.fromkeys(seqs, 0), False
        last_k, chained_before = 0, False
        if trace is not None:
            trace.append([])
        while any(done[s] < tokens for s in seqs):
            live = [s for s in seqs if done[s] < tokens]
            joining = 0 if drafted_last and all(held[s] for s in live) else sum(
                max(0, skipped[s] - STEADY_PENDING) if held[s] else PROMPT_TOKENS + done[s] for s in live)
            horizon = int(statistics.median_low(tokens - done[s] for s in live))
            k = policy.lengths(live, join=lambda: Join(joining, horizon))[0] if policy else fixed_k
            if trace is not None:
                trace[-1].append(k)
            ms = [accepted(k, first[s] - (early_drop if done[s] < early_tokens else 0.0), p1, draws[s]) if k else 0
                  for s in live]
            if TAIL_P[0] and k:
                tail = lookup_tail_length(len(live), k)
                ms = [m + accepted(tail, TAIL_P[0], TAIL_P[0], draws[s]) if m == k else m for s, m in zip(live, ms)]
            draft_s, rest_s = step_cost(mode, len(live), k, rng)
            if SENT_AHEAD[0]:
                chained = k > 0 and last_k > 0
                sent = chained and chained_before
                if k and not chained:
                    rest_s += UNCHAINED_MS[0] / 1000
                elif k and not sent:
                    rest_s += NOT_SENT_MS[0] / 1000
                steady = sent if SENT_AHEAD[0] == "sent" else k == last_k
                chained_before = chained
            else:
                steady = k == last_k
                if k and not steady:
                    rest_s += UNCHAINED_MS[0] / 1000
            last_k = k
            joined = joining if k else 0
            draft_s += joined * JOIN_S_PER_TOKEN
            if policy:
                policy.observe(live, [k] * len(live), ms)
                # a join step's draft time is not a steady cost of its length, nor is an unchained
                # step's verification (as the scheduler)
                policy.observe_costs(len(live), 0 if joined else k, draft_s, k,
                                     rest_s if steady or not k or TIME_UNSTEADY[0] else None, joined=joined)
            seconds += draft_s + rest_s
            for s, m in zip(live, ms):
                done[s] += m + 1
                if k:
                    drafted[s] = [drafted[s][0] + m + 1, drafted[s][1] + 1]
                    held[s], skipped[s] = True, 0
                else:
                    skipped[s] += 1
            drafted_last = k > 0
        rates = [t / n for t, n in drafted.values() if n]
        if len(rates) == batch and batch > 1:
            realized = min(rates) / statistics.fmean(rates)
        if policy:
            for s in seqs:
                policy.forget(s)
        per_round.append(1000 * seconds / tokens)
    return statistics.median(per_round[1:]), policy, realized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(COSTS), default="greedy")
    parser.add_argument("--costs", choices=sorted(COST_SETS), default="h100-2026-11-25",
                        help="the per-bucket step costs replayed (see COST_SETS)")
    parser.add_argument("--unchained-ms", type=float, default=0.0,
                        help="extra ms of a speculative step whose length differs from the step before (UNCHAINED_MS)")
    parser.add_argument("--min-step-ms", type=float, default=0.0,
                        help="the least a speculative step costs (MIN_STEP_MS)")
    parser.add_argument("--sent-ahead", choices=["length", "sent"], default="",
                        help="model steps sent ahead; the policy timed by the scheduler's rule (SENT_AHEAD)")
    parser.add_argument("--not-sent-ms", type=float, default=0.0,
                        help="extra ms of a chained step not sent ahead (NOT_SENT_MS)")
    parser.add_argument("--time-unsteady", action="store_true",
                        help="give the policy those steps' times too, as the scheduler did before 0c62e3b")
    parser.add_argument("--p0", type=float, nargs=2, default=(0.88, 0.97))
    parser.add_argument("--p1", type=float, default=0.86)
    parser.add_argument("--batches", type=int, nargs="+", default=(1, 2, 4, 8))
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--early-tokens", type=int, default=0)
    parser.add_argument("--early-drop", type=float, default=0.0)
    parser.add_argument("--explore", type=int, default=None, help="MIN_EXPLORED_SEQUENCE_STEPS")
    parser.add_argument("--rounds-trace", type=int, default=0, help="print auto's draft lengths for this many runs")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a draft_length constant for this run, e.g. SEQUENCE_PRIOR_STEPS=8 (repeatable)")
    parser.add_argument("--policy-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a MeasuredCost argument, e.g. initial=3 (repeatable)")
    parser.add_argument("--same-prompts", action="store_true",
                        help="every round the same batch again, as `bass bench speed` runs it")
    parser.add_argument("--tail-p", type=float, default=0.0,
                        help="lookup tails after fully accepted drafts, each token kept with this probability (TAIL_P)")
    args = parser.parse_args()
    SAME_PROMPTS[0] = args.same_prompts
    TAIL_P[0] = args.tail_p
    if args.mode not in COST_SETS[args.costs]:
        parser.error(f"--costs {args.costs} has no {args.mode} costs")
    COSTS.update(COST_SETS[args.costs])
    UNCHAINED_MS[0] = args.unchained_ms
    TIME_UNSTEADY[0] = args.time_unsteady
    SENT_AHEAD[0], NOT_SENT_MS[0] = args.sent_ahead, args.not_sent_ms
    MIN_STEP_MS[0] = args.min_step_ms
    for setting in args.set:
        name, value = setting.split("=", 1)
        assert hasattr(draft_length, name), name
        setattr(draft_length, name, float(value))
    for setting in args.policy_arg:
        name, value = setting.split("=", 1)
        POLICY_ARGS[name] = int(value) if value.lstrip("-").isdigit() else float(value)
    if args.explore is not None:
        draft_length.MIN_EXPLORED_SEQUENCE_STEPS = args.explore
    p0, early = tuple(args.p0), (args.early_tokens, args.early_drop)
    for batch in args.batches:
        fixed = {k: statistics.median(one_run(s, batch, args.mode, p0, args.p1, args.rounds, k, early)[0]
                                      for s in range(10))
                 for k in (0, 2, 3, 4)}
        traces = [[] for _ in range(args.runs)]
        runs = [one_run(s, batch, args.mode, p0, args.p1, args.rounds, early=early, trace=traces[s])
                for s in range(args.runs)]
        auto = [ms for ms, _, _ in runs]
        # What the policy expects of a new batch's pace at k = 4 (the share its bucket remembers), against
        # the pace fixed k = 4's batches realized (slowest sequence's tokens per step over the mean's).
        believed = [policy.batch_tail(list(range(-batch, 0)), 4) for _, policy, _ in runs]
        realized = [one_run(s, batch, args.mode, p0, args.p1, args.rounds, 4, early)[2] for s in range(10)]
        print(f"{args.mode} batch {batch}: fixed " + ", ".join(f"k={k} {v:.3f}" for k, v in fixed.items())
              + f"; auto {statistics.fmean(auto):.3f} (ended at regular's speed in "
              f"{sum(ms >= 0.99 * fixed[0] for ms in auto) / len(auto):.0%} of runs); a new batch's "
              f"pace at k = 4 believed {statistics.median(believed):.2f} "
              f"({min(believed):.2f}-{max(believed):.2f}), realized {statistics.median(realized):.2f}", flush=True)
        for s in range(min(args.rounds_trace, args.runs)):
            print(f"  run {s} ({runs[s][0]:.3f}): " + " | ".join("".join(map(str, r)) for r in traces[s]))


if __name__ == "__main__":
    main()
