"""`auto` against fixed draft lengths at several batch sizes: a simulation of the policy alone.

No models. Step costs are the H100's (in-process, chained proposals, bench/results
2026-11-25-h100-fused-draft: sweeps at 9441552): a regular step and a speculative step's
verification by batch size, a draft forward 1.1-1.2 ms. Each sequence's accepted drafts follow
a chain (the first draft accepted with probability P0, each further one after an acceptance
with P1), and a sequence moves between easy and hard stretches of text (acceptance is not
steady along a text). Prompts differ: one in `--slow-every` is a slow one (lower P0 and P1), as
one of HumanEval's first eight is at T = 0.8. As `bass bench speed` does: a warm-up batch of
16 tokens, then rounds of 128 tokens per sequence, the whole batch waiting for its last sequence,
one policy throughout; prints the last round's ms per token per sequence.

    python bench/auto_batch_sim.py                  # batches 1-64, auto against k = 0, 3, 4
"""

from __future__ import annotations

import argparse
import random
import statistics

from bass.coordinator.draft_length import FixedLength, MeasuredCost

# ms, from the sweeps (step_ms of fixed-k runs less their draft share; regular steps' step_ms).
REGULAR_MS = {1: 2.06, 2: 2.1, 4: 2.15, 8: 2.2, 16: 2.3, 32: 2.5, 64: 2.9}
VERIFY_MS = {1: 3.0, 2: 3.3, 4: 3.4, 8: 3.5, 16: 3.9, 32: 4.7, 64: 6.5}  # at k = 3-4, host work included
DRAFT_FORWARD_MS = {1: 1.0, 2: 1.05, 4: 1.05, 8: 1.0, 16: 0.95, 32: 0.85, 64: 0.85}


class Sequence:
    def __init__(self, rng: random.Random, slow: bool, p0: float, p1: float):
        self.rng, self.hard = rng, False
        self.p = (p0 - 0.2, p1 - 0.15) if slow else (p0, p1)

    def accepted(self, k: int) -> int:
        # hard stretches of ~5 steps, a fifth of the time
        if self.rng.random() < (0.2 if self.hard else 0.05):
            self.hard = not self.hard
        p0, p1 = self.p
        if self.hard:
            p0, p1 = p0 - 0.3, p1 - 0.2
        m, p = 0, p0
        while m < k and self.rng.random() < p:
            m, p = m + 1, p1
        return m


def one_run(policy, batch: int, seed: int, args) -> list[float]:
    rng = random.Random(seed)
    out, next_id = [], 0
    for tokens in [16] + [128] * args.rounds:
        seqs = {next_id + i: Sequence(rng, i % args.slow_every == args.slow_every - 1, args.p0, args.p1)
                for i in range(batch)}
        next_id += batch
        done = dict.fromkeys(seqs, 0)
        ms = 0.0
        while any(d < tokens for d in done.values()):
            live = [s for s, d in done.items() if d < tokens]
            ks = policy.lengths(live)
            ms_accepted = [seqs[s].accepted(k) if k else 0 for s, k in zip(live, ks)]
            policy.observe(live, ks, ms_accepted)
            k = ks[0]
            bucket = min(b for b in REGULAR_MS if b >= len(live))
            draft = k * DRAFT_FORWARD_MS[bucket]
            verify = VERIFY_MS[bucket] if k else REGULAR_MS[bucket]
            policy.observe_costs(len(live), k, draft / 1000, k, verify / 1000)
            ms += draft + verify
            for s, m in zip(live, ms_accepted):
                done[s] += m + 1
                if done[s] >= tokens:
                    policy.forget(s)
        out.append(ms / tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p0", type=float, default=0.93)
    parser.add_argument("--p1", type=float, default=0.97)
    parser.add_argument("--slow-every", type=int, default=6)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    args = parser.parse_args()
    policies = {"0": lambda: FixedLength(0), "3": lambda: FixedLength(3), "4": lambda: FixedLength(4),
                "auto": MeasuredCost}
    for batch in [int(b) for b in args.batches.split(",")]:
        row = {name: statistics.median(one_run(make(), batch, seed, args)[-1] for seed in range(args.runs))
               for name, make in policies.items()}
        best = min(v for name, v in row.items() if name != "auto")
        print(f"batch {batch:3d}: " + "  ".join(f"{name} {v:.3f}" for name, v in row.items())
              + f"   auto / best {row['auto'] / best:.3f}")


if __name__ == "__main__":
    main()
