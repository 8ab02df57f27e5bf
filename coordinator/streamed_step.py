"""The executor of streamed speculation: the target verifies whatever a free-running draft has drafted.

A speculative step that asks the draft for k tokens waits for them (and, across processes, for a
round trip); an earlier design that asked for the next step's tokens while the target verified
this one (pipelined speculation, removed once this one measured faster at every batch: bench/results
2026-11-27-h200x2-streamed) still waited for them at the next step. Here the draft never waits and
is never waited for. It runs on its own GPU as a loop
(draft_service/stream.py) that keeps drafting every sequence up to a lookahead past what the
target committed; its tokens stream to the coordinator while the target verifies. Each step:

    1. collect the drafts that arrived (`DraftsAhead` keeps those that continue the committed text);
    2. the target verifies, per sequence, up to `block` of them (short blocks padded with stand-ins,
       so every step has one shape and replays the target's CUDA graphs);
    3. the verdicts go straight back to the draft (`StreamControl.commits`), without waiting.

A block accepted whole costs nothing: the draft went on drafting past it meanwhile, and where its
next token is the target's own, those tokens are the next block. Where the target disagrees, the
draft drops what it drafted past that point and drafts again from the committed tokens; until
its new tokens arrive, that sequence verifies stand-ins, which the target accepts only where they
are its own tokens: what followed the last recurrence of its latest tokens in its own text
(coordinator/lookup_drafts.py), else its last token repeated. A step waits for the draft only
where a drafting sequence holds nothing yet, and then at most `wait_s`.

Lossless as every step is: the target decides each position by its own keyed race
(engine/verification.py); the drafts only decide how many positions one step covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bass.coordinator.draft_ahead import DraftsAhead
from bass.coordinator.sequences import SequenceRun
from bass.core.errors import WorkerUnavailableError
from bass.core.worker_api import (AddSequence, DraftStream, FollowSequence, StreamCommit, StreamControl,
                                  TargetWorkerAPI, VerifyItem, VerifyRequest, VerifyResponse)

# A draft that neither streams nor fails (its process hung) would leave every step verifying
# stand-ins, and the commits queueing on its stream, for good: after this long with sequences
# waiting for drafts and nothing arriving, the stream counts as failed (regular decoding, and
# the scheduler probes the draft as after any failure).
STALL_S = 10.0


@dataclass
class StreamPlan:
    """One streamed step as the scheduler planned it."""

    batch: list[SequenceRun]
    rooms: list[int]  # per sequence, the most drafts its cache still takes after its pending token
    step_started: float
    target_add: list[AddSequence]
    target_release: list[int]
    draft_add: list[AddSequence] = field(default_factory=list)
    draft_release: list[int] = field(default_factory=list)


@dataclass
class StreamOutcome:
    drafts: list[tuple[int, ...]]  # the drafts verified, stand-ins left out (for the statistics)
    verified: VerifyResponse
    draft_wait_s: float  # how long the step waited for drafts to arrive
    verify_s: float
    draft_error: Exception | None = None
    arrived: int = 0  # draft tokens that arrived since the last step
    kept: int = 0  # of them, those that continued the committed text
    starved: int = 0  # sequences the draft follows that had no draft to verify
    draft_busy_s: float = 0.0  # the draft's time in its proposals since the last step
    looked_up: int = 0  # stand-ins taken from the sequences' own text (lookup)
    lookup_kept: int = 0  # of them, those the target accepted


class StreamedStep:
    def __init__(self, target: TargetWorkerAPI, clock: Callable[[], float], block: int, wait_s: float,
                 lookup: int = 0):
        """lookup: the longest n-gram matched for stand-ins from a sequence's own text (0: its
        last token repeated)."""
        if block < 1:
            raise ValueError(f"a streamed step verifies blocks of >= 1 token, got {block}")
        self.target, self.clock, self.block, self.wait_s = target, clock, block, wait_s
        self.ahead = DraftsAhead(lookup)
        self.stream: DraftStream | None = None
        self._busy_s = 0.0  # the stream's busy_s at the last step
        self._starving_since: float | None = None  # clock() since sequences waited with nothing arriving

    def open(self, stream: DraftStream) -> None:
        self.close()
        self.stream, self._busy_s, self._starving_since = stream, 0.0, None

    def close(self) -> None:
        """The draft went down, restarted or is no longer wanted: nothing it drafted stands."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                pass
        self.ahead.clear()

    def forget(self, seq_ids) -> None:
        for seq_id in seq_ids:
            self.ahead.forget(seq_id)

    def execute(self, plan: StreamPlan) -> StreamOutcome:
        batch, error, arrived, kept = plan.batch, None, 0, 0
        started = self.clock()
        try:
            by_id = {s.seq_id: s for s in batch}
            self._send(StreamControl(
                release=plan.draft_release, add=plan.draft_add,
                follow=[FollowSequence(a.seq_id, by_id[a.seq_id].sampling) for a in plan.draft_add]))
            for add in plan.draft_add:
                self.ahead.follow(add.seq_id, list(add.prompt_ids))
            arrived, kept = self._collect(batch)
        except Exception as exc:  # noqa: BLE001 - speculation is optional; never fail a request for it
            error = exc
        draft_wait_s = self.clock() - started
        blocks, real, looked_up, starved = self._blocks(batch, plan.rooms, drafts=error is None)
        started = self.clock()
        verified = self.target.verify(VerifyRequest(
            items=[VerifyItem(s.seq_id, b, s.sampling) for s, b in zip(batch, blocks)],
            add=plan.target_add, release=plan.target_release))
        verify_s = self.clock() - started
        if error is None:
            try:
                self._send(StreamControl(commits=[
                    StreamCommit(s.seq_id, tuple(v.tokens)) for s, v in zip(batch, verified.verdicts)
                    if self.ahead.follows(s.seq_id)]))
            except Exception as exc:  # noqa: BLE001
                error = exc
        lookup_kept = 0
        for seq, verdict, drafted, filled in zip(batch, verified.verdicts, real, looked_up):
            self.ahead.commit(seq.seq_id, list(verdict.tokens))
            # Every token but the last is an accepted position: the drafts first, then the lookup's.
            lookup_kept += min(filled, max(0, len(verdict.tokens) - 1 - len(drafted)))
        busy_s = self.stream.busy_s if self.stream is not None else self._busy_s
        outcome = StreamOutcome(drafts=real, verified=verified, draft_wait_s=draft_wait_s, verify_s=verify_s,
                                draft_error=error, arrived=arrived, kept=kept, starved=starved,
                                draft_busy_s=max(0.0, busy_s - self._busy_s), looked_up=sum(looked_up),
                                lookup_kept=lookup_kept)
        self._busy_s = busy_s
        return outcome

    def _blocks(self, batch: list[SequenceRun], rooms: list[int], drafts: bool):
        """Per sequence, the tokens to verify: its drafts (none where `drafts` is false: the stream
        failed), then lookups, then its last token repeated, `block` in all (fewer where its
        cache has no room). Returns (blocks, the drafts in them, the lookups in them, how many
        followed sequences had no draft)."""
        blocks, real, looked_up, starved = [], [], [], 0
        for seq, room in zip(batch, rooms):
            most = min(self.block, room)
            block = self.ahead.block(seq.seq_id, most) if drafts else ()
            real.append(block)
            starved += not block and self.ahead.follows(seq.seq_id)
            filler = self.ahead.lookup(seq.seq_id, block, most - len(block))
            looked_up.append(len(filler))
            block += filler
            last = block[-1] if block else _last_token(seq)
            blocks.append((block + (last,) * (self.block - len(block)))[:max(0, room)])
        return blocks, real, looked_up, starved

    def _send(self, control: StreamControl) -> None:
        if control.add or control.release or control.follow or control.commits:
            self.stream.send(control)

    def _collect(self, batch: list[SequenceRun]) -> tuple[int, int]:
        """Take what arrived; where a drafting sequence holds no draft yet, wait for more, at
        most wait_s. Returns (tokens arrived, tokens kept)."""
        arrived, kept = self.ahead.deliver(self.stream.receive())
        deadline = self.clock() + self.wait_s
        while self._starving(batch):
            left = deadline - self.clock()
            if left <= 0:
                break
            more = self.ahead.deliver(self.stream.receive(left))
            arrived, kept = arrived + more[0], kept + more[1]
        self._check_stall(batch, arrived)
        return arrived, kept

    def _starving(self, batch: list[SequenceRun]) -> bool:
        """Whether a sequence the draft follows holds no draft."""
        return any(self.ahead.follows(s.seq_id) and not self.ahead.held(s.seq_id) for s in batch)

    def _check_stall(self, batch: list[SequenceRun], arrived: int) -> None:
        if arrived or not self._starving(batch):
            self._starving_since = None
            return
        now = self.clock()
        if self._starving_since is None:
            self._starving_since = now
        elif now - self._starving_since > STALL_S:
            raise WorkerUnavailableError(f"the draft stream sent nothing for {now - self._starving_since:.0f} s "
                                         "while sequences waited for drafts")


def _last_token(seq: SequenceRun) -> int:
    return seq.output[-1] if seq.output else seq.request.prompt_ids[-1]
