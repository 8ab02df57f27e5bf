"""Does a sequence's text depend on its batch or its draft length? `bass bench invariance`.

Sampled tokens are a function of (target distribution, seed, position) by construction, so
only numerics can move them: a row's logits can differ in the last bits between a batch of 1
and of 64, or between a verification forward of k + 1 rows and a decode forward of one row
(kernels choose their tiling by shape). Near-ties then flip a token, and the text diverges
from there. This runs the same seeded requests (greedy and sampled) alone with regular
decoding (the reference), alone under each policy, and all together under each policy, and
counts the sequences that differ and where they first do.
"""

from __future__ import annotations

import logging
import time

from bass.app.local import build_local_workers
from bass.coordinator.requests import GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.config import DraftLengthConfig, RunnerConfig, SamplingParams, SchedulerConfig

log = logging.getLogger(__name__)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where the two differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(reference: list[list[int]], other: list[list[int]]) -> dict:
    diffs = [first_difference(r, o) for r, o in zip(reference, other, strict=True)]
    positions = [d for d in diffs if d is not None]
    return {"sequences": len(diffs), "differ": len(positions),
            "first_difference_positions": sorted(positions)[:20]}


def measure(target: RunnerConfig, draft: RunnerConfig | None, prompts: list[str], *, modes: dict[str, SamplingParams],
            policies: list[str], max_new_tokens: int, seed: int = 0, progress=None) -> list[dict]:
    codec = load_codec(target.model_dir)
    target_worker, draft_worker = build_local_workers(target, draft)

    def run(policy: str, requests: list[GenerationRequest], together: bool) -> list[list[int]]:
        config = DraftLengthConfig.parse(policy)
        scheduler = Scheduler(target_worker, draft_worker if config.speculates else None, codec,
                              SchedulerConfig(max_batch_size=max(len(requests), 1), max_new_tokens=max_new_tokens,
                                              draft_length=config))
        results = scheduler.generate(requests) if together else [scheduler.generate([r])[0] for r in requests]
        return [r.sequences[0].token_ids for r in results]

    rows = []
    for name, params in modes.items():
        requests = [GenerationRequest(prompt=p, max_new_tokens=max_new_tokens, sampling=params, seed=seed + i,
                                      ignore_eos=True) for i, p in enumerate(prompts)]
        started = time.perf_counter()
        reference = run("0", requests, together=False)
        row = {"mode": name, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
               "reference": "each request alone, regular decoding (k = 0)", "runs": {}}
        for policy in policies:
            for together in (False, True):
                if policy == "0" and not together:
                    continue
                label = f"{'batch of ' + str(len(requests)) if together else 'alone'}, policy {policy}"
                row["runs"][label] = compare(reference, run(policy, requests, together))
                if progress:
                    progress(f"{name}: {label}: {row['runs'][label]['differ']} of {len(requests)} differ")
        row["wall_time_s"] = round(time.perf_counter() - started, 1)
        log.info("%s", row)
        rows.append(row)
    return rows
