"""How often `auto` settles on the wrong mode at one sequence: a simulation of the policy alone.

No models: each step's cost is the H100's at batch 1 (bench/results, "2026-11-25 (chained
proposals)": a draft forward 1.2 ms, a speculative step's verification 2.16 ms, a regular
step 2.13 ms), and each step's accepted drafts follow a chain where the first draft is accepted
with probability P0 and each further one, after an acceptance, with P1 (acceptance runs are
correlated on real text). As `bass bench speed` does, a warm-up of 16 tokens and then rounds of
128 tokens, a new sequence each, one policy throughout. Prints the last round's ms per token
over many runs and the share of runs that ended decoding regularly.

    python bench/policy/auto_alone_sim.py                  # P0 0.85, P1 0.95: k = 4 ~20% faster
    python bench/policy/auto_alone_sim.py --p0 0.6 --p1 0.7  # speculation does not pay
"""

from __future__ import annotations

import argparse
import random
import statistics

from bass.coordinator.draft_length import MeasuredCost

DRAFT_FORWARD_S, VERIFY_S, REGULAR_S = 1.2e-3, 2.16e-3, 2.13e-3


def accepted(k: int, p0: float, p1: float, rng: random.Random) -> int:
    m, p = 0, p0
    while m < k and rng.random() < p:
        m, p = m + 1, p1
    return m


def one_run(seed: int, p0: float, p1: float, rounds: int) -> list[float]:
    """ms per token of each round (the warm-up first)."""
    rng, policy = random.Random(seed), MeasuredCost()
    out = []
    for seq_id, tokens in enumerate([16] + [128] * rounds):
        done, seconds = 0, 0.0
        while done < tokens:
            k = policy.lengths([seq_id])[0]
            m = accepted(k, p0, p1, rng) if k else 0
            policy.observe([seq_id], [k], [m])
            draft_s, verify_s = (DRAFT_FORWARD_S * k, VERIFY_S) if k else (0.0, REGULAR_S)
            policy.observe_costs(1, k, draft_s, k, verify_s)
            done, seconds = done + m + 1, seconds + draft_s + verify_s
        policy.forget(seq_id)
        out.append(1000 * seconds / tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p0", type=float, default=0.85)
    parser.add_argument("--p1", type=float, default=0.95)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run(seed, args.p0, args.p1, args.rounds) for seed in range(args.runs)]
    rng = random.Random(0)
    tokens_k4 = statistics.fmean(accepted(4, args.p0, args.p1, rng) + 1 for _ in range(100_000))
    last, first = [r[-1] for r in runs], [r[1] for r in runs]
    print(f"k = 4 alone: {1000 * (4 * DRAFT_FORWARD_S + VERIFY_S) / tokens_k4:.3f} ms/token "
          f"({tokens_k4:.2f} tokens a step); regular: {1000 * REGULAR_S:.3f}")
    print(f"auto, first round: median {statistics.median(first):.3f} ms/token; last round: median "
          f"{statistics.median(last):.3f}, share ending regular "
          f"{sum(x >= 1000 * REGULAR_S - 1e-9 for x in last) / len(last):.3f}")


if __name__ == "__main__":
    main()
