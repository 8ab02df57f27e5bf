"""Where the host's time goes in an in-process speculative step, with and without chained
proposals (SpeculativeStep._chain_next), and what one CUDA graph replay costs the host.

Usage (GPU machine, after setup.sh): python3 step_phases.py TARGET DRAFT OUT_JSON CASE...
where a CASE is MODE:BATCH:K (MODE as in `bass bench speed`, K a fixed draft length).
For each case it runs the first 16 HumanEval prompts (128 new tokens, a warm-up round first)
chained, then unchained, on the same workers, and reports per step: the step's wall time, and
the host's time inside each phase (the target's launch, the draft's launch, the waits for the
draft's tokens and for the verdicts, the commit). Then, per batch bucket, the host time of one
replay of the draft's next-token graph and of the target's verification graph, launched 24
times back to back, against their GPU time.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from bass.app.humaneval_problems import load_problems, select
from bass.app.bench.speed import MODES
from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig
from bass.coordinator.requests import GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.app.local import build_local_workers

NEW_TOKENS = 128
REPLAYS = 24  # < MAX_STEPS - 1: the draft's step index stays inside its token buffer


class PhaseTimer:
    """Accumulates host seconds per phase by wrapping callables (instance attributes, removed
    again by `unwrap`)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.wrapped: list[tuple[object, str]] = []

    def unwrap(self) -> None:
        for obj, name in self.wrapped:
            delattr(obj, name)

    def wrap(self, obj, name: str, phase: str, then=None) -> None:
        fn = getattr(obj, name)
        self.wrapped.append((obj, name))

        def timed(*args, **kwargs):
            started = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[phase] += time.perf_counter() - started
            return then(out) if then is not None else out

        setattr(obj, name, timed)


def instrument(scheduler: Scheduler, timer: PhaseTimer) -> None:
    target, draft = scheduler.target, scheduler.draft

    def pending_verify(pending):
        timer.wrap(pending, "result", "verify_wait")
        return pending

    def proposal(p):
        timer.wrap(p, "result", "draft_wait")
        return p

    def chained(c):
        timer.wrap(c, "select", "draft_select", then=proposal)
        timer.wrap(c, "reconcile", "draft_reconcile")
        return c

    timer.wrap(target, "start_verify", "verify_launch", then=pending_verify)
    timer.wrap(draft, "start_propose", "draft_launch", then=proposal)
    timer.wrap(draft, "start_chained", "chain_launch", then=chained)
    timer.wrap(scheduler, "_commit", "commit")
    timer.wrap(scheduler.policy, "lengths", "policy")


def run_case(target_worker, draft_worker, codec, prompts, mode: str, batch: int, k: int, chained: bool) -> dict:
    scheduler = Scheduler(target_worker, draft_worker, codec,
                          SchedulerConfig(max_batch_size=batch, max_n=1, max_new_tokens=NEW_TOKENS,
                                          draft_length=DraftLengthConfig.parse(str(k))))
    scheduler.speculative.chains = chained

    def run(round_: int):
        return scheduler.generate([GenerationRequest(prompt=prompts[i % len(prompts)], max_new_tokens=NEW_TOKENS,
                                                     ignore_eos=True, sampling=MODES[mode], seed=1000 * round_ + i)
                                   for i in range(batch)])

    run(0)
    torch.cuda.synchronize()
    timer = PhaseTimer()
    instrument(scheduler, timer)
    steps_before = scheduler.step_stats.steps
    started = time.perf_counter()
    run(1)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    timer.unwrap()
    steps = scheduler.step_stats.steps - steps_before
    phases = {phase: round(1000 * s / steps, 3) for phase, s in sorted(timer.seconds.items())}
    return {"mode": mode, "batch": batch, "k": k, "chained": chained, "steps": steps,
            "ms_per_step": round(1000 * wall / steps, 3), "ms_per_token_per_sequence": round(1000 * wall / NEW_TOKENS, 3),
            "host_ms_per_step": phases}


@torch.inference_mode()
def replay_costs(target_worker, draft_worker, buckets: list[int]) -> list[dict]:
    """Host and GPU time of one replay of the draft's next-token graph and of the target's
    k = 4 verification graph (REPLAYS back-to-back replays; the draft's step index restarts
    first, since each replay advances it through a buffer of MAX_STEPS tokens)."""
    out = []
    for bucket in buckets:
        for name, replay in (("draft next (greedy)", draft_worker.loop.next[(bucket, "greedy")]),
                             ("target verify q=5", target_worker.runner.graphs.graphs[(bucket, 5, 5)].graph.replay)):
            draft_worker.loop.buffers[bucket].index.fill_(1)
            replay()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(REPLAYS):
                replay()
            host = time.perf_counter() - started
            torch.cuda.synchronize()
            total = time.perf_counter() - started
            out.append({"graph": name, "bucket": bucket, "host_us_per_launch": round(1e6 * host / REPLAYS, 1),
                        "us_per_replay": round(1e6 * total / REPLAYS, 1)})
    return out


def main() -> None:
    target, draft, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cases = [c.split(":") for c in sys.argv[4:]]
    slots = max(int(b) for _, b, _ in cases)
    runner = dict(device="cuda", dtype="bfloat16", num_slots=slots, max_seq_len=1024, attention="triton")
    prompts = [p["prompt"] for p in select(load_problems(), "0:16")]
    started = time.perf_counter()
    target_worker, draft_worker = build_local_workers(RunnerConfig(model_dir=target, **runner),
                                                      RunnerConfig(model_dir=draft, **runner))
    print(json.dumps({"workers_built_and_warmed_s": round(time.perf_counter() - started, 1)}), flush=True)
    codec = load_codec(Path(target))
    results = []
    for mode, batch, k in cases:
        for chained in (True, False):
            row = run_case(target_worker, draft_worker, codec, prompts, mode, int(batch), int(k), chained)
            print(json.dumps(row), flush=True)
            results.append(row)
    costs = replay_costs(target_worker, draft_worker, sorted({int(b) for _, b, _ in cases}))
    for row in costs:
        print(json.dumps(row), flush=True)
    out.write_text(json.dumps({"cases": results, "replays": costs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
