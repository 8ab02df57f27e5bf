"""Where an in-process step's time goes, for several (mode, batch, policy) runs in one process:
wall time per step against the GPU's busy time per step (the kernels' summed time; busy much
under wall means the host or a sync is the bound), and the kernels that fill it.

Usage (GPU machine, after setup.sh): python3 profile_steps.py TARGET DRAFT OUT_DIR CASE...
where a CASE is MODE:BATCH:POLICY, e.g. t0.8-p0.95:64:0 (MODE as in `bass bench speed`).
Writes OUT_DIR/profile-MODE-bBATCH-kPOLICY.txt per case (a traced run's steps, the policy's
costs, then the profile; PROFILE=0: the traced run only) and prints a summary of each.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bass.app.bench.speed import case_requests, case_scheduler
from bass.coordinator.step_stats import StepStats
from case_workers import case_workers, parse_cases

NEW_TOKENS = int(os.environ.get("PROFILE_TOKENS", 128))
DEVICE = os.environ.get("PROFILE_DEVICE", "cuda")  # cpu: a smoke test of this script


def main() -> None:
    target, draft, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cases = parse_cases(sys.argv[4:])
    target_worker, draft_worker, codec, prompts = case_workers(target, draft, cases, DEVICE)
    for mode, batch, policy in cases:
        scheduler = case_scheduler(target_worker, draft_worker, codec, batch, policy, NEW_TOKENS)  # as bench speed

        def run(tokens: int, round_: int):
            return scheduler.generate(case_requests(prompts, batch, mode, tokens, round_))

        run(min(16, NEW_TOKENS), 0)
        run(NEW_TOKENS, 1)  # the policy learns its costs, as in `bass bench speed`'s first round
        _sync()
        # A traced run without the profiler (whose host overhead would distort every step).
        scheduler.step_stats = traced = StepStats(trace=[])
        started = time.perf_counter()
        run(NEW_TOKENS, 2)
        _sync()
        traced_ms = 1000 * (time.perf_counter() - started) / NEW_TOKENS
        report = [f"{mode} batch {batch} policy {policy}: {traced_ms:.3f} ms/token/seq unprofiled, {traced.steps} "
                  f"steps {dict(sorted(traced.steps_by_length.items()))}"]
        if hasattr(scheduler.policy, "describe"):
            report.append(f"policy state: {scheduler.policy.describe()}")
        report.append("trace (k, sequences, tokens, draft ms, timed verify ms, ms since the previous commit):")
        last = started
        for k, seqs, tokens, draft_s, timed, _, at in traced.trace:
            report.append(f"  {k} {seqs} {tokens} {1000 * draft_s:.2f} {'-' if timed is None else f'{1000 * timed:.2f}'}"
                          f" {1000 * (at - last):.2f}")
            last = at
        print(report[0] + ("\n" + report[1] if len(report) > 1 and "policy" in report[1] else ""), flush=True)
        if os.environ.get("PROFILE", "1") != "0":
            scheduler.step_stats = StepStats()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                run(NEW_TOKENS, 3)
                _sync()
                wall = time.perf_counter() - started
            st = scheduler.step_stats
            events = prof.key_averages()
            busy_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            steps = max(st.steps, 1)
            summary = (f"profiled: {1000 * wall / NEW_TOKENS:.3f} ms/token/seq, {st.steps} steps, wall "
                       f"{1000 * wall / steps:.3f} ms/step, GPU busy {busy_us / 1000 / steps:.3f} ms/step, "
                       f"breakdown {st.to_dict()['breakdown_ms_per_step']}")
            print(summary, flush=True)
            report += ["", summary, events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70),
                       events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)]
        (out / f"profile-{mode}-b{batch}-k{policy}.txt").write_text("\n".join(report) + "\n")

def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
