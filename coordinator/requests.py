"""What a client asks for and what it gets back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from bass.config import SamplingParams
from bass.errors import InvalidRequestError


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (text or token ids) and how to continue it, n times."""

    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    n: int = 1
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    speculate: bool = True
    time_budget_ms: int = 0  # 0 = none; counted from submission

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise InvalidRequestError("prompt", "give exactly one of prompt or prompt_ids")
        if self.prompt is not None and not self.prompt:
            raise InvalidRequestError("prompt", "must not be empty")
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
            if not self.prompt_ids:
                raise InvalidRequestError("prompt_ids", "must not be empty")
            if any(not isinstance(t, int) or t < 0 for t in self.prompt_ids):
                raise InvalidRequestError("prompt_ids", "must be non-negative integers")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError("n", f"must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidRequestError("max_new_tokens", f"must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 1 << 64):
            raise InvalidRequestError("seed", f"must be an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.time_budget_ms, int) or self.time_budget_ms < 0:
            raise InvalidRequestError("time_budget_ms", f"must be an integer >= 0, got {self.time_budget_ms!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids", "must be non-negative integers")


class FinishReason(str, Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_new_tokens reached
    TIME_BUDGET = "time_budget"  # the request's time budget ran out first (text is partial)
    CANCELLED = "cancelled"  # the client went away; never returned to anyone


@dataclass(frozen=True)
class SequenceOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    finish_order: int = 0  # 1 = finished first (stop or length) among the request's sequences; 0 = did not


@dataclass
class RequestStats:
    steps: int = 0
    sequence_steps: int = 0  # steps summed over the request's sequences
    draft_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # sequence-steps whose drafts were cut short by a rejection
    generated_tokens: int = 0
    wall_time_s: float = 0.0
    queue_time_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def token_acceptance(self) -> float:
        """Estimated chance that one draft token is accepted given its prefix was (alpha): each
        accepted token is a success and each rejection a failure; tokens after a rejection
        were never tested, so this does not depend on the draft length the way
        acceptance_rate does."""
        tested = self.accepted_tokens + self.rejections
        return self.accepted_tokens / tested if tested else math.nan

    def to_dict(self) -> dict:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 4)

        return {"steps": self.steps, "sequence_steps": self.sequence_steps, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "rejections": self.rejections, "generated_tokens": self.generated_tokens,
                "acceptance_rate": num(self.acceptance_rate), "token_acceptance": num(self.token_acceptance),
                "wall_time_s": round(self.wall_time_s, 4), "queue_time_s": round(self.queue_time_s, 4)}


@dataclass(frozen=True)
class GenerationResult:
    sequences: list[SequenceOutput]
    stats: RequestStats

    def to_dict(self) -> dict:
        return {"sequences": [{"index": s.index, "text": s.text, "token_ids": s.token_ids,
                               "finish_reason": s.finish_reason.value, "finish_order": s.finish_order}
                              for s in self.sequences],
                "stats": self.stats.to_dict()}
