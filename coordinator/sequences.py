"""What the coordinator knows of a request and of each of its sequences while they run.

A request (`RequestRun`) has n sequences (`SequenceRun`), each with its own output, text, stop
state and randomness key. The scheduler plans steps over sequences; the executors run them on
the workers; the commit extends each sequence with the tokens its verdict emitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bass.coordinator.incremental_text import IncrementalText
from bass.coordinator.requests import FinishReason, GenerationRequest, GenerationResult, RequestStats
from bass.coordinator.stopping import StopCriteria
from bass.core.worker_api import SequenceSampling

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sequence_seed_key(seed: int, index: int) -> int:
    """The randomness key of sample `index` of a request: depends on nothing else."""
    return splitmix64(seed ^ splitmix64(index))


@dataclass
class SequenceRun:
    seq_id: int
    index: int
    request: "RequestRun"
    sampling: SequenceSampling
    text: IncrementalText  # the output's text (a stop token id contributes none)
    output: list[int] = field(default_factory=list)
    unsent_to_draft: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text_end: int | None = None
    drafted: bool = False  # whether the draft worker holds this sequence
    steps_in_flight: int = 0  # regular steps sent for it and not yet committed
    finish_order: int = 0  # 1 = finished first within its request
    finish_ms: float = 0.0  # from the request's submission to finishing (stop or length)


@dataclass
class RequestRun:
    request: GenerationRequest
    prompt_ids: list[int]
    criteria: StopCriteria
    sequences: list[SequenceRun] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    result: GenerationResult | None = None
    # (sequence index, tokens committed this step, finish reason or None), drained by the caller
    deltas: list[tuple[int, list[int], FinishReason | None]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    @property
    def deadline(self) -> float | None:
        budget = self.request.time_budget_ms
        return self.submitted + budget / 1000 if budget else None


@dataclass
class PrefillBudget:
    """Prompt tokens the workers may prefill in one step, both workers together. A worker
    prefills its new sequences before the step's forward, so every running sequence waits
    for all of it: bounding it bounds the stall an arrival (or a burst) causes. Whatever comes
    first in a step is taken even over the limit, alone, so a long prompt is never starved."""

    limit: int
    used: int = 0

    def take(self, tokens: int) -> bool:
        if self.used and self.used + tokens > self.limit:
            return False
        self.used += tokens
        return True
