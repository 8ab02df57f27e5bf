"""The host time `auto` (MeasuredCost) takes before each step: `lengths` plus the step's
`observe_costs`, at batch sizes 8 and 64, after 40 speculative and 20 regular steps of history.
No models and no GPU; the policy's own Python work, which a step pays on the host.

    python bench/policy/auto_policy_cost.py
"""

from __future__ import annotations

import random
import time

from bass.coordinator.draft_length import MeasuredCost

STEPS = 2000


def per_step_us(batch: int) -> float:
    rng = random.Random(0)
    policy, seq_ids = MeasuredCost(), list(range(batch))
    for _ in range(40):
        policy.observe(seq_ids, [4] * batch, [rng.randint(0, 4) for _ in seq_ids])
        policy.observe_costs(batch, 4, 0.005, 4, 0.003)
    for _ in range(20):
        policy.observe_costs(batch, 0, 0.0, 0, 0.0021)
    started = time.perf_counter()
    for _ in range(STEPS):
        policy.lengths(seq_ids)
        policy.observe_costs(batch, 0, 0.0, 0, 0.0021)
    return 1e6 * (time.perf_counter() - started) / STEPS


if __name__ == "__main__":
    for batch in (8, 64):
        print(f"batch {batch}: {min(per_step_us(batch) for _ in range(5)):.1f} us per step (best of 5)")
