"""Where a round's first step goes: the time from submitting a batch to its first commit.

`bass bench speed --trace` showed the first commit of a 128-token round 18-50 ms after its start
on an H100 (regular decoding included) against ~2 ms for a regular step after it: 10-20% of a
round at 1-8 sequences. This script runs the bench's in-process case (same requests, same
scheduler), times each of a round's first scheduler steps with a device sync after it, then
profiles the first step alone: the torch profiler's kernels and CPU ops, and cProfile's Python
functions.

Usage (GPU machine, after setup.sh): python3 first_step.py TARGET DRAFT OUT_DIR CASE...
where a CASE is MODE:BATCH:POLICY, e.g. greedy:1:0. Writes OUT_DIR/first-step-MODE-bBATCH-kPOLICY.txt.
FIRST_STEP_DEVICE=cpu runs it on the CPU (a smoke test).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bass.app.bench.speed import case_requests, case_scheduler
from case_workers import case_workers, parse_cases

NEW_TOKENS = 32
DEVICE = os.environ.get("FIRST_STEP_DEVICE", "cuda")
TIMED_STEPS = 6


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed_steps(scheduler, requests) -> list[str]:
    """Each of the round's first steps' wall time (synced after each), then the rest untimed."""
    lines = []
    started = time.perf_counter()
    for r in requests:
        scheduler.submit(r)
    lines.append(f"  submit: {1000 * (time.perf_counter() - started):.2f} ms")
    for i in range(TIMED_STEPS):
        t = time.perf_counter()
        scheduler.step()
        _sync()
        committed = scheduler.step_stats.steps
        lines.append(f"  step {i}: {1000 * (time.perf_counter() - t):.2f} ms (steps committed so far: {committed})")
    _finish(scheduler)
    return lines


def _finish(scheduler) -> None:
    """The round's remaining steps, untimed."""
    while scheduler.has_work:
        scheduler.step()
    scheduler.flush_releases()
    _sync()


def first_step_profiles(scheduler, requests) -> list[str]:
    """The torch profiler and cProfile over submit + the first step."""
    for r in requests:
        scheduler.submit(r)
    _sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    py = cProfile.Profile()
    with profile(activities=activities) as prof:
        py.enable()
        scheduler.step()
        _sync()
        py.disable()
    _finish(scheduler)
    out = ["torch profiler, by self CPU time:",
           prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)]
    if DEVICE == "cuda":
        out += ["torch profiler, by device time:",
                prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=70)]
    text = io.StringIO()
    pstats.Stats(py, stream=text).sort_stats("cumulative").print_stats(45)
    out += ["cProfile, cumulative:", text.getvalue()]
    return out


def main() -> None:
    target, draft, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    cases = parse_cases(sys.argv[4:])
    target_worker, draft_worker, codec, prompts = case_workers(target, draft, cases, DEVICE)
    for mode, batch, policy in cases:
        scheduler = case_scheduler(target_worker, draft_worker, codec, batch, policy, NEW_TOKENS)
        scheduler.generate(case_requests(prompts, batch, mode, 16, 0))  # warm-up, as bench speed
        scheduler.generate(case_requests(prompts, batch, mode, NEW_TOKENS, 1))
        _sync()
        report = [f"{mode} batch {batch} policy {policy}: a round's first steps, synced after each"]
        for round_ in (2, 3):
            report += timed_steps(scheduler, case_requests(prompts, batch, mode, NEW_TOKENS, round_))
        report += first_step_profiles(scheduler, case_requests(prompts, batch, mode, NEW_TOKENS, 4))
        text = "\n".join(report)
        (out / f"first-step-{mode}-b{batch}-k{policy}.txt").write_text(text)
        print("\n".join(report[:2 * (TIMED_STEPS + 1) + 1]), flush=True)


if __name__ == "__main__":
    main()
