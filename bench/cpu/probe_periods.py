"""What a one-step probe of another draft length costs, and what the scheduler times of it.

`auto` (coordinator/draft_length.py) probes a neighbour of its length for one step every
`probe_every` steps. The scheduler prices a step for the policy only where the step before drafted
the same length (`Scheduler._commit_speculative`), so a one-step probe is never timed, and a
length auto only probes is priced by extrapolation from the length it drafts. This runs the real
Scheduler over bench/cpu/speculative_period.py's stand-in pair (the real Speculation and session
transport; stand-in GPU work of k draft forwards and a verification a step, steps chained and sent
ahead as over a co-located pair) with scripted lengths: 4 with a one-step probe of 3 and of 2 every
8 steps, then 3 and 2 throughout. It prints each step's period (commit to commit) by the length
before it and its own, and how many steps of each length the policy was given a time for.

    .venv/bin/python bench/cpu/probe_periods.py [--draft-ms 0.65] [--verify-ms 1.6] [--host-ms 1.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "cpu"))

import speculative_period  # noqa: E402
from bass.coordinator.draft_length import FixedLength  # noqa: E402

PATTERNS = [[4] * 7 + [3] + [4] * 7 + [2]] * 3 + [[3]] * 2 + [[2]] * 2  # the first of each kind warms up


class ScriptedLengths(FixedLength):
    """Lengths from a repeating pattern; records which steps the scheduler timed."""

    def __init__(self, pattern: list[int]):
        super().__init__(pattern[0])
        self.pattern, self.steps = pattern, 0
        self.timed: dict[int, list[int]] = {}  # k -> [untimed steps, timed steps]

    def lengths(self, seq_ids, join=None):
        k = self.pattern[self.steps % len(self.pattern)]
        self.steps += 1
        return [k] * len(seq_ids)

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        self.timed.setdefault(verify_k, [0, 0])[verify_s is not None] += 1


def run(address: str, codec, pattern: list[int]) -> tuple[dict, dict]:
    from bass.coordinator.requests import GenerationRequest
    from bass.coordinator.scheduler import Scheduler
    from bass.core.config import DraftLengthConfig, SamplingParams, SchedulerConfig
    from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker

    draft = RemoteDraftWorker(address)
    target = RemoteTargetWorker(address, draft=draft)
    try:
        scheduler = Scheduler(target, draft, codec, SchedulerConfig(
            max_batch_size=1, max_n=1, max_new_tokens=400, draft_length=DraftLengthConfig.parse(str(pattern[0]))))
        policy = scheduler.policy = ScriptedLengths(pattern)
        commits: list[tuple[float, int]] = []
        commit = scheduler._commit_speculative

        def timed_commit(plan, outcome):
            finished = commit(plan, outcome)
            commits.append((time.perf_counter(), max(outcome.lengths, default=0)))
            return finished
        scheduler._commit_speculative = timed_commit
        scheduler.generate([GenerationRequest(prompt="def f(n):\n    ", max_new_tokens=400, ignore_eos=True,
                                              sampling=SamplingParams(), seed=0)])
    finally:
        target.close()
        draft.close()
    periods: dict[tuple[int, int], list[float]] = {}
    for (before, k_before), (at, k) in zip(commits, commits[1:]):
        periods.setdefault((k_before, k), []).append(1000 * (at - before))
    return periods, policy.timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft-ms", type=float, default=0.65)
    parser.add_argument("--verify-ms", type=float, default=1.6)
    parser.add_argument("--host-ms", type=float, default=1.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    from bass.coordinator.tokenizer import load_codec
    from tiny_models import save_tokenizer

    lines = [f"stand-in GPU: draft forward {args.draft_ms} ms, verification {args.verify_ms} ms, "
             f"worker host {args.host_ms} ms a call; one sequence, steps chained and sent ahead"]
    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(Path(tmp) / "tokenizer")
        codec = load_codec(Path(tmp) / "tokenizer")
        pair = speculative_period.StandInPairProcess(args.draft_ms, args.verify_ms, args.host_ms,
                                                     f"unix:{tmp}/pair.sock")
        try:
            seen: set = set()
            for pattern in PATTERNS:
                periods, timed = run(pair.address, codec, pattern)
                if tuple(pattern) not in seen:  # a warm-up run of each pattern
                    seen.add(tuple(pattern))
                    continue
                lines.append(f"lengths {pattern}:")
                for (k_before, k), values in sorted(periods.items()):
                    lines.append(f"  k {k} after k {k_before}: {len(values)} steps, median period "
                                 f"{statistics.median(values):.3f} ms (GPU work {k * args.draft_ms + args.verify_ms:.2f})")
                lines.append("  steps the policy was given a time for, k: [untimed, timed]: "
                             + ", ".join(f"{k}: {v}" for k, v in sorted(timed.items())))
        finally:
            pair.stop()
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
