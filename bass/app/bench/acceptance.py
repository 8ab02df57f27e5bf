"""Draft acceptance on HumanEval prompts: how often the target keeps the draft's tokens.

For each sampling mode and draft length, all selected prompts run through the in-process
engine (n sequences each, batched) and the result records accepted / proposed tokens, the
per-token acceptance alpha, committed tokens per sequence-step, and wall time.
"""

from __future__ import annotations

import logging
import time

from bass.app.local import build_local_workers
from bass.coordinator.requests import GenerationRequest, RequestStats
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.config import DraftLengthConfig, RunnerConfig, SamplingParams, SchedulerConfig

log = logging.getLogger(__name__)

MODES = {
    "greedy": SamplingParams(),
    "t0.8-p0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "t0.2-p0.95": SamplingParams(temperature=0.2, top_p=0.95),
}


def total(stats: list[RequestStats]) -> RequestStats:
    out = RequestStats()
    for s in stats:
        for field in ("steps", "sequence_steps", "draft_tokens", "accepted_tokens", "rejections", "generated_tokens"):
            setattr(out, field, getattr(out, field) + getattr(s, field))
    return out


def measure(target: RunnerConfig, draft: RunnerConfig, prompts: list[str], *, n: int, max_new_tokens: int,
            draft_lengths: list[str], modes: list[str], batch_prompts: int, draft_top_n: int = 64,
            seed: int = 0, progress=None) -> list[dict]:
    codec = load_codec(target.model_dir)
    target_worker, draft_worker = build_local_workers(target, draft, draft_top_n=draft_top_n)
    rows = []
    for mode in modes:
        for length in draft_lengths:
            policy = DraftLengthConfig.parse(length)
            scheduler = Scheduler(target_worker, draft_worker if policy.speculates else None, codec,
                                  SchedulerConfig(max_batch_size=batch_prompts * n, max_n=n,
                                                  max_new_tokens=max_new_tokens, draft_length=policy))
            requests = [GenerationRequest(prompt=p, n=n, max_new_tokens=max_new_tokens, sampling=MODES[mode],
                                          seed=seed + i) for i, p in enumerate(prompts)]
            stats, t0 = [], time.perf_counter()
            for start in range(0, len(requests), batch_prompts):
                stats += [r.stats for r in scheduler.generate(requests[start:start + batch_prompts])]
                if progress:
                    progress(f"{mode} k={length}: {min(start + batch_prompts, len(requests))}/{len(requests)} prompts")
            wall = time.perf_counter() - t0
            t = total(stats)
            row = {"mode": mode, "draft_length": length, "prompts": len(prompts), "n": n,
                   "max_new_tokens": max_new_tokens, **{k: v for k, v in t.to_dict().items() if k != "wall_time_s"},
                   "tokens_per_sequence_step": round(t.generated_tokens / t.sequence_steps, 3),
                   "wall_time_s": round(wall, 2), "tokens_per_s": round(t.generated_tokens / wall, 1),
                   # rough: batch-wide throughput turned into per-sequence latency
                   "ms_per_token_per_sequence": round(1000 * batch_prompts * n * wall / t.generated_tokens, 3)}
            log.info("%s", row)
            rows.append(row)
    return rows
