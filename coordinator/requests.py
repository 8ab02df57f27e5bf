"""What a client asks for and what it gets back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from bass.core.config import SamplingParams
from bass.core.errors import InvalidRequestError

if TYPE_CHECKING:
    from bass.core.config import CoordinatorConfig


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
    first_index: int = 0  # the first sequence's index: indices and seeded keys count from it

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
        if not isinstance(self.first_index, int) or not 0 <= self.first_index <= (1 << 32) - 1 - self.n:
            raise InvalidRequestError("first_index", f"must be an integer >= 0 with first_index + n < 2**32, "
                                      f"got {self.first_index!r} (n = {self.n})")
        if not isinstance(self.time_budget_ms, int) or self.time_budget_ms < 0:
            raise InvalidRequestError("time_budget_ms", f"must be an integer >= 0, got {self.time_budget_ms!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids", "must be non-negative integers")


def check_request_size(request: GenerationRequest, max_seq_len: int, max_token_bytes: int | None,
                       config: "CoordinatorConfig") -> None:
    """Refuse what cannot fit before doing any work on it (tokenizing a 60 MB prompt took minutes
    and gigabytes only to be refused for its length afterwards).

    A text prompt of B UTF-8 bytes tokenizes to at least B / max_token_bytes tokens (no token
    stands for more text than that), so one over max_token_bytes x (max_seq_len -
    max_new_tokens) bytes can never fit; token id prompts are counted directly."""
    room = max_seq_len - request.max_new_tokens
    if room < 1:
        raise InvalidRequestError("max_new_tokens", f"{request.max_new_tokens} leaves no room for a prompt "
                                  f"within max_seq_len {max_seq_len}")
    if request.prompt_ids is not None and len(request.prompt_ids) > room:
        raise InvalidRequestError("prompt_token_ids", f"{len(request.prompt_ids)} tokens + max_new_tokens "
                                  f"({request.max_new_tokens}) exceeds max_seq_len {max_seq_len}")
    if request.prompt is not None and max_token_bytes:
        limit = room * max_token_bytes
        size = len(request.prompt.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise InvalidRequestError("prompt", f"{size} bytes cannot fit: with max_new_tokens "
                                      f"{request.max_new_tokens} and max_seq_len {max_seq_len} a prompt holds at "
                                      f"most {room} tokens of at most {max_token_bytes} bytes each")
    if len(request.stop) > config.max_stop_strings:
        raise InvalidRequestError("stop", f"{len(request.stop)} stop strings exceed the limit of "
                                  f"{config.max_stop_strings}")
    for s in request.stop:
        if len(s.encode("utf-8", "surrogatepass")) > config.max_stop_string_bytes:
            raise InvalidRequestError("stop", f"a stop string of {len(s.encode('utf-8', 'surrogatepass'))} bytes "
                                      f"exceeds the limit of {config.max_stop_string_bytes} bytes")


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
    # From submission to finishing (stop or length; 0 = did not): for a router merging a split
    # request's finish orders, so not in to_dict (a time in the sequences would make two runs'
    # outputs differ).
    finish_ms: float = 0.0


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
