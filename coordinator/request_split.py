"""One request's n sequences spread over several replicas (`bass router`), and their answers
put back together.

A replica decodes a request's sequences as one batch on its one GPU, and a step costs more the
more sequences the batch holds (one H200, `auto`, greedy: 1.04 ms a token at 4 sequences, 1.31 at
8, 1.7 at 16; bench/results/2026-11-28-h200x2-speculate-ahead/a1-ab-greedy.txt). Where a second
replica has room, a request of n = 8 finishes sooner as two of 4. Each part is the client's
request with its own `n` and `first_index` (a contiguous range of the indices), so each sequence
keeps its index and, sampled with a seed, its randomness key: the parts sample exactly the
sequences of the whole request (greedy ones as a batch of n / parts does).

Answers merged here: a unary answer's sequences in index order, their `finish_order` taken again
over the whole request from each one's `finish_ms` (the time from its part's arrival at its
replica: the parts arrive within a fraction of a millisecond of each other); a stream's deltas pass
on as they come (their indices are already the request's), each part's closing stats held back
and sent once, merged, after the last part's. Stats: steps, time and queue time the longest
part's (the parts run side by side), token counts summed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bass.v1 import generation_pb2 as pb


@dataclass(frozen=True)
class Part:
    first_index: int
    n: int
    raw: bytes  # the request as the part's replica receives it


def part_sizes(n: int, parts: int) -> list[int]:
    """n sequences over `parts` parts, as even as possible, the larger parts first."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def split_request(request: pb.GenerateRequest, parts: int) -> list[Part]:
    """The request as `parts` requests, each of a contiguous range of its sequences."""
    out, first = [], request.first_index
    for size in part_sizes(request.n or 1, parts):
        part = pb.GenerateRequest()
        part.CopyFrom(request)
        part.n, part.first_index = size, first
        out.append(Part(first, size, part.SerializeToString()))
        first += size
    return out


def merge_stats(stats: list[pb.Stats]) -> pb.Stats:
    draft = sum(s.draft_tokens for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    return pb.Stats(steps=max((s.steps for s in stats), default=0), draft_tokens=draft, accepted_tokens=accepted,
                    generated_tokens=sum(s.generated_tokens for s in stats),
                    acceptance_rate=accepted / draft if draft else math.nan,
                    time_ms=max((s.time_ms for s in stats), default=0.0),
                    queue_ms=max((s.queue_ms for s in stats), default=0.0))


def merge_answers(answers: list[pb.GenerateResponse]) -> pb.GenerateResponse:
    """The parts' unary answers as the whole request's."""
    merged = pb.GenerateResponse(sequences=sorted((s for a in answers for s in a.sequences), key=lambda s: s.index),
                                 stats=merge_stats([a.stats for a in answers]))
    # Within a part, sequences that finish later have a larger finish_ms (ties only within one
    # step, where the part numbered them in index order): this order keeps each part's own.
    finished = sorted((s for s in merged.sequences if s.finish_order), key=lambda s: (s.finish_ms, s.index))
    for order, sequence in enumerate(finished, 1):
        sequence.finish_order = order
    return merged


class StreamMerge:
    """The parts' GenerateStream messages as one stream."""

    def __init__(self) -> None:
        self.stats: list[pb.Stats] = []

    def pass_on(self, raw: bytes) -> bytes | None:
        """What of a part's message goes to the client now: all of it, its deltas without its
        closing stats, or nothing (stats alone)."""
        message = pb.GenerateStreamResponse.FromString(raw)
        if not message.HasField("stats"):
            return raw
        stats = pb.Stats()
        stats.CopyFrom(message.stats)
        self.stats.append(stats)
        if not message.deltas:
            return None
        message.ClearField("stats")
        return message.SerializeToString()

    def closing(self) -> bytes:
        """The last message: every part's stats, merged."""
        return pb.GenerateStreamResponse(stats=merge_stats(self.stats)).SerializeToString()
