"""Where a `bass bench speed` run's time goes outside its steady steps: the time to the first
commit (the prompts' prefill on the target, host and GPU), the time from the last commit to
generate()'s return (results, releases), and the slow steps between (with the pinned host
allocations and garbage collections made during each, two suspects).

At batch 64 regular greedy on an H100 (bench/results, 2026-11-25 night) a run of 0.425 s had
its first commit at 57 ms and its last at 396 ms, and a burst of slow steps (4-20 ms) at steps
8-20 in one process: 0.7 ms/token/seq of 3.3 outside the steady steps.

Usage (GPU machine, after setup.sh): python3 run_edges.py TARGET DRAFT CASE... (CASE as in
profile_steps.py: MODE:BATCH:POLICY). Prints one block per case and round.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import torch

from bass.app.bench.speed import case_requests, case_scheduler
from bass.coordinator.step_stats import StepStats
from case_workers import case_workers, parse_cases

NEW_TOKENS = int(os.environ.get("EDGES_TOKENS", 128))
DEVICE = os.environ.get("EDGES_DEVICE", "cuda")  # cpu: a smoke test of this script


class Timed:
    """Wraps obj.name, adding each call's host seconds (and, with gpu=True, its CUDA-event
    span, read once the run is over) to lists."""

    def __init__(self, obj, name: str, gpu: bool = False):
        self.host: list[float] = []
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        inner = getattr(obj, name)

        def wrapped(*args, **kwargs):
            started = time.perf_counter()
            if gpu:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            try:
                return inner(*args, **kwargs)
            finally:
                if gpu:
                    end.record()
                    self.events.append((begin, end))
                self.host.append(time.perf_counter() - started)

        setattr(obj, name, wrapped)

    def reset(self) -> None:
        self.host.clear()
        self.events.clear()

    def gpu_ms(self) -> float:
        return sum(b.elapsed_time(e) for b, e in self.events)


def host_allocations() -> int | None:
    """Pinned host blocks allocated so far (the pinned allocator growing its pool), or None
    where this torch does not report them."""
    stats = getattr(torch.cuda, "host_memory_stats", lambda: {})()
    value = stats.get("num_host_alloc", stats.get("allocations.allocated"))
    return None if value is None else int(value)


def grew(before: int | None, after: int | None) -> int | str:
    """Allocations between two readings ("n/a" where torch reports none)."""
    return "n/a" if before is None or after is None else after - before


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    target, draft = sys.argv[1], sys.argv[2]
    cases = parse_cases(sys.argv[3:])
    target_worker, draft_worker, codec, prompts = case_workers(target, draft, cases, DEVICE)
    prefill = Timed(target_worker.runner, "add", gpu=DEVICE == "cuda")
    for mode, batch, policy in cases:
        scheduler = case_scheduler(target_worker, draft_worker, codec, batch, policy, NEW_TOKENS)  # as bench speed
        finish, flush = Timed(scheduler, "_finish"), Timed(scheduler, "flush_releases")
        allocs_at_step: list[int] = []
        step = scheduler.step

        def counted_step():
            out = step()
            allocs_at_step.append(host_allocations())
            return out

        scheduler.step = counted_step
        pauses: list[tuple[float, float]] = []
        gc_started = [0.0]

        def on_gc(phase, info):
            now = time.perf_counter()
            if phase == "start":
                gc_started[0] = now
            else:
                pauses.append((gc_started[0], now - gc_started[0]))

        def run(tokens: int, round_: int):
            return scheduler.generate(case_requests(prompts, batch, mode, tokens, round_))

        run(min(16, NEW_TOKENS), 0)  # warm-up, as `bass bench speed` does
        sync()
        gc.callbacks.append(on_gc)
        for round_ in range(1, 4):
            for t in (prefill, finish, flush):
                t.reset()
            allocs_at_step.clear()
            pauses.clear()
            before = host_allocations()
            scheduler.step_stats = StepStats(trace=[])
            t0 = time.perf_counter()
            run(NEW_TOKENS, round_)
            returned = time.perf_counter() - t0
            sync()
            trace = scheduler.step_stats.trace
            commits = [at - t0 for *_, at in trace]
            gaps = [b - a for a, b in zip(commits, commits[1:])]
            median = statistics.median(gaps)
            slow = [(i + 1, round(1000 * g, 1), grew(allocs_at_step[i], allocs_at_step[i + 1]) if i + 1 < len(allocs_at_step) else None)
                    for i, g in enumerate(gaps) if g > 1.5 * median]
            print(f"{mode} batch {batch} policy {policy} round {round_}: {1000 * returned / NEW_TOKENS:.3f} ms/token/seq; "
                  f"first commit {1000 * commits[0]:.1f} ms (prefill host {1000 * sum(prefill.host):.1f}, GPU "
                  f"{prefill.gpu_ms():.1f}); steps {1000 * (commits[-1] - commits[0]):.1f} ms over {len(gaps)} "
                  f"(median {1000 * median:.2f}); after the last commit {1000 * (returned - commits[-1]):.1f} ms "
                  f"(_finish {1000 * sum(finish.host):.1f}, flush_releases {1000 * sum(flush.host):.1f}); pinned host "
                  f"allocations {grew(before, host_allocations())}; gc {len(pauses)} pauses {1000 * sum(p for _, p in pauses):.1f} ms",
                  flush=True)
            print(f"  slow steps (index, ms, pinned allocations during it): {slow}", flush=True)
        gc.callbacks.remove(on_gc)


if __name__ == "__main__":
    main()
