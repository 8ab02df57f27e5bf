"""The host time `auto` (MeasuredCost) takes before each step: `lengths` plus the step's
`observe_costs`, at batch sizes 8 and 64, after 40 speculative and 20 regular steps of history.
No models and no GPU; the policy's own Python work, which a step pays on the host. "near tie":
64 sequences decoding regularly where the best draft length scores 4% behind (inside
THIN_REGULAR_LEAD, so a thin probe is due) and the probe's join, priced as Scheduler._join
prices it (a pass over the batch), is too dear to run (2026-11-28: an H100 process at 64).

    python bench/policy/auto_policy_cost.py
"""

from __future__ import annotations

import random
import statistics
import time

from bass.coordinator.draft_length import Join, MeasuredCost

STEPS = 2000


def per_step_us(batch: int, near_tie: bool = False) -> float:
    rng = random.Random(0)
    policy, seq_ids = MeasuredCost(), list(range(batch))
    for _ in range(40):
        policy.observe(seq_ids, [4] * batch, [rng.randint(0, 4) for _ in seq_ids])
        policy.observe_costs(batch, 4, 0.005, 4, 0.003)
    regular_s = 0.0021
    join = None
    if near_tie:
        scores = policy.scores(batch, seq_ids) or [0.0] * 5
        regular_s = 1 / (1.04 * max(scores[1:])) if any(scores) else regular_s
        policy.joins = [1.0, 1000]  # 1 ms a joined token: never affordable
        unsent = [list(range(30)) for _ in seq_ids]  # what Scheduler._join reads of each sequence
        budgets = [88] * batch

        def join():
            return Join(tokens=sum(max(0, len(u) - 2) for u in unsent), horizon=statistics.median_low(budgets))
    for _ in range(20):
        policy.observe_costs(batch, 0, 0.0, 0, regular_s)
    policy.yields.seen = lambda k: 10 ** 6  # past the floor of drafted steps before regular decoding
    started = time.perf_counter()
    for _ in range(STEPS):
        policy.lengths(seq_ids, join=join)
        policy.observe_costs(batch, 0, 0.0, 0, regular_s)
    return 1e6 * (time.perf_counter() - started) / STEPS


if __name__ == "__main__":
    for batch, near_tie in ((8, False), (64, False), (64, True)):
        name = f"batch {batch}" + (", near tie" if near_tie else "")
        print(f"{name}: {min(per_step_us(batch, near_tie) for _ in range(5)):.1f} us per step (best of 5)")
