"""The executor of regular decoding: Verify calls with no drafts, kept in flight.

Over a target that overlaps calls, the scheduler sends step t + 1's Verify before it reads step
t's answer, so the worker finds each call waiting when it finishes the last, instead of idling
through a round trip and the commit. Each step's input is the target's own last token, which
the worker already holds, so nothing in a step waits on the answers before it.

How many steps stay in flight after a commit is the target's (`steps_in_flight`): one
in-process, where the next call's launch follows the commit at once; two over the services,
where an answer's way back, the commit and the next frame's way out cross two processes and, at
64 sequences on an H100, took longer than the GPU's step (~2.9 ms against 2.3), which with one
in flight the GPU idled through. A sequence that finished in a step still in flight runs in the
steps sent before its commit: their extra tokens are computed and dropped, and its slot
released with the next call. A sequence whose length the steps in flight complete is left out
of the next one (every regular step commits one token a sequence), so no sequence runs past
its max_new_tokens on the worker, whose cache may have room for exactly that many.

The scheduler plans each step (which sequences, what the workers add and release) and commits
the answers; this object only sends, holds and answers the calls in launch order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from bass.coordinator.sequences import SequenceRun
from bass.core.worker_api import (AddSequence, PendingVerify, TargetWorkerAPI, VerifyItem, VerifyRequest,
                                  VerifyResponse)


@dataclass
class InFlight:
    """A regular step's Verify, sent and not yet committed."""

    pending: PendingVerify
    batch: list[SequenceRun]
    clean: bool  # no prefill in it: its time is a steady-state cost for the policy
    send_s: float
    # Sent while the previous regular step was in flight: a pipeline's first step starts on
    # an idle GPU and waits out its whole latency, which no later step does.
    follows: bool = False


@dataclass(frozen=True)
class Answered:
    """A regular step's answer, ready to commit."""

    batch: list[SequenceRun]
    verified: VerifyResponse
    verify_s: float  # the loop's time spent on this call: sending it and waiting for its answer
    # Its time is a steady-state cost of regular decoding: no prefill in it, sent behind another
    # call and committed behind the next (a call committed alone, the last of a run or a lone
    # k = 0 probe, waits out its whole step, which no run of regular steps does).
    steady: bool


class RegularPipeline:
    def __init__(self, target: TargetWorkerAPI, depth: int, clock: Callable[[], float]):
        """depth: how many calls stay in flight after a commit (the target's steps_in_flight)."""
        self.target, self.depth, self.clock = target, depth, clock
        self.in_flight: deque[InFlight] = deque()  # sent, not yet committed, oldest first

    def __len__(self) -> int:
        return len(self.in_flight)

    def send(self, batch: list[SequenceRun], add: list[AddSequence], release: list[int], step_started: float) -> bool:
        """Send one regular step for `batch`; returns whether the pipeline is full, i.e. the
        oldest call is to be answered and committed now (else it is still filling)."""
        pending = self.target.start_verify(VerifyRequest(
            items=[VerifyItem(s.seq_id, (), s.sampling) for s in batch], add=add, release=release))
        for seq in batch:
            seq.steps_in_flight += 1
        self.in_flight.append(InFlight(pending, batch, clean=not add, send_s=self.clock() - step_started,
                                       follows=bool(self.in_flight)))
        return len(self.in_flight) > self.depth

    def answer_oldest(self, overlapped: bool) -> Answered:
        """Wait for the oldest call's answer. overlapped: the next regular step was sent first,
        so this wait is the steady state's."""
        flight = self.in_flight.popleft()
        for seq in flight.batch:
            seq.steps_in_flight -= 1
        started = self.clock()
        verified = flight.pending.result()
        verify_s = flight.send_s + self.clock() - started
        return Answered(flight.batch, verified, verify_s, steady=flight.clean and overlapped and flight.follows)

    def discard(self) -> None:
        """Forget every call in flight: their answers, if they come, answer nobody."""
        for flight in self.in_flight:
            flight.pending.discard()
        self.in_flight.clear()


class PairedPeriods:
    """What a regular step costs, for the policy: the mean of two consecutive steady periods
    (commit to commit), not one.

    With steps kept in flight, a run's commits can come in uneven pairs: over the services on the
    CPU, places 2 / 3 of a run read 0.71 / 3.82 ms where the run settles at ~2.1 (bench/results,
    2026-11-28), and a k = 0 probe that timed one step got the same half of the pair each time.
    On an H100 at 64 sequences one process priced a regular step at 3.98 ms where its regular
    steps took 2.88, and drafted where regular decoding was as fast. The mean of two neighbours
    cancels such a pair and is otherwise the same average. A period that is not steady (None)
    ends the run: the next pair starts after it."""

    def __init__(self):
        self._last: float | None = None

    def add(self, period: float | None) -> float | None:
        """The next commit's period (None: not steady); the price it gives, or None."""
        last, self._last = self._last, period
        if period is None or last is None:
            return None
        return (last + period) / 2
