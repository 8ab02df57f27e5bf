"""The draft running ahead of the target on its own: streamed speculation's draft half.

In a speculative step the target waits for the draft's tokens and the draft for the target's
verdict. With a GPU each, neither need wait: this loop keeps drafting for every sequence it
follows, past its own unverified tokens, up to `lookahead` tokens ahead of what the target
committed, and publishes each call's tokens as soon as they are on the host. The coordinator
verifies whatever has arrived (coordinator/streamed_step.py) and sends back what the target
committed. Where that agrees with what the draft drafted, nothing is lost: the tokens drafted
meanwhile stand. Where it does not, the draft drops its tokens past the commit, starts a new
*epoch* for the sequence and drafts again from the committed tokens (the coordinator discards
the old epoch's tokens that were still on their way).

Each call of the loop drafts `chunk` tokens per drafting sequence, and one call is always queued
on the device while the host reads the one before (`step`). A call is a DraftWorker proposal,
the tokens drafted before passed as `assumed` (the worker forgets them at its next call, before
it commits what the target decided): the same graphs, sampling and cache rollback as a
speculative step's proposal, so a sampled draft token is still the winner of the target's keyed
race at its position, whatever the epoch. While only agreeing commits arrive, the next call
*extends* the last proposal on the device instead (DraftWorker.extend: more replays of its
self-feeding graph), which needs nothing from the host. A commit may reach past the tokens the
loop has read into those still in flight (`_Followed.overrun`): they are checked when read.

`LocalDraftStream` runs the loop on a thread of the coordinator's process (tests, and a draft
in the coordinator's process); the draft service runs it for a stream RPC
(draft_service/stream_host.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from bass.core.config import DraftStreamConfig
from bass.core.errors import InvalidRequestError, WorkerUnavailableError
from bass.core.worker_api import ProposeItem, ProposeRequest, SequenceSampling, StreamControl, StreamDrafts
from bass.transport.draft_stream import Mailbox

log = logging.getLogger(__name__)

DEFAULT_LOOKAHEAD = DraftStreamConfig.lookahead  # where a stream's first message leaves them 0
DEFAULT_CHUNK = DraftStreamConfig.chunk
IDLE_WAIT_S = 0.5  # with nothing to draft, how long the loop sleeps before looking again


@dataclass
class _Followed:
    """A sequence the loop drafts for."""

    sampling: SequenceSampling
    length: int  # tokens committed (prompt included), as far as the draft has heard
    drafted: list[int] = field(default_factory=list)  # past what the target committed, not yet verified
    # Committed tokens past the end of what the draft has read of its own drafts: the tokens of
    # the proposal in flight are checked against them when read (`extend`). One of `drafted`
    # and `overrun` is always empty.
    overrun: list[int] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  # committed, not yet given to the worker
    epoch: int = 0

    @property
    def chain_end(self) -> int:
        """The position the draft's next tokens are drafted at."""
        return self.length + len(self.drafted) - len(self.overrun)

    def commit(self, tokens: tuple[int, ...]) -> None:
        """The target committed `tokens` after what it committed before."""
        self.unsent.extend(tokens)
        self.length += len(tokens)
        if self.overrun:
            self.overrun.extend(tokens)
            return
        n = min(len(self.drafted), len(tokens))
        if list(tokens[:n]) != self.drafted[:n]:
            self._restart()
            return
        del self.drafted[:n]  # what remains was drafted from exactly the committed tokens
        self.overrun.extend(tokens[n:])

    def extend(self, tokens: list[int]) -> bool:
        """Tokens the draft drafted at chain_end; False where they contradict what was
        committed meanwhile (the sequence then starts over in a new epoch)."""
        n = min(len(tokens), len(self.overrun))
        if list(tokens[:n]) != self.overrun[:n]:
            self._restart()
            return False
        del self.overrun[:n]
        self.drafted.extend(tokens[n:])
        return True

    def restart_at_committed(self) -> None:
        """A fresh proposal drafts from the committed tokens: nothing in flight is checked."""
        self.overrun.clear()

    def _restart(self) -> None:
        self.drafted.clear()
        self.overrun.clear()
        self.epoch += 1


@dataclass
class _InFlight:
    """A proposal queued on the draft's device: per sequence (its answer's order), the epoch it
    drafts in and how many tokens."""

    pending: object  # PendingProposal
    seq_ids: list[int]
    epochs: list[int]
    counts: list[int]


class StreamingDraft:
    def __init__(self, worker, *, lookahead: int = DEFAULT_LOOKAHEAD, chunk: int = DEFAULT_CHUNK,
                 lock: threading.Lock | None = None):
        """worker: a DraftWorker; lock: held around every use of the worker (a service's lock,
        shared with its other calls)."""
        if lookahead < 1:
            raise InvalidRequestError("lookahead", f"must be >= 1, got {lookahead}")
        if not 1 <= chunk <= lookahead:
            raise InvalidRequestError("chunk", f"must be in [1, lookahead = {lookahead}], got {chunk}")
        self.worker, self.lookahead, self.chunk = worker, lookahead, chunk
        self.lock = lock or threading.Lock()
        self._followed: dict[int, _Followed] = {}
        self._inbox: deque[StreamControl] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._inflight: _InFlight | None = None  # the proposal queued on the device
        self._changed = False  # since the last proposal started: it cannot be extended
        self._busy_since: float | None = None
        self.calls = 0  # proposals and extensions made (statistics, tests)
        self.busy_s = 0.0  # time with one in flight

    # -- any thread ------------------------------------------------------------------------------
    def control(self, message: StreamControl) -> None:
        with self._wake:
            self._inbox.append(message)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    def busy_total(self) -> float:
        """Seconds with a proposal in flight since the stream opened, the current one included."""
        since = self._busy_since
        return self.busy_s + (time.perf_counter() - since if since is not None else 0.0)

    # -- the loop's thread -----------------------------------------------------------------------
    def run(self, publish: Callable[[list[StreamDrafts]], None]) -> None:
        """Draft until closed, publishing each call's tokens. An error from the worker ends the
        loop (raised to the caller)."""
        while not self._closed:
            drafted = self.step()
            if drafted is None:
                self.idle()
            else:
                publish(drafted)

    def idle(self) -> None:
        """Nothing to draft: sleep until a message arrives (or a while passes)."""
        with self._wake:
            if not self._inbox and not self._closed:
                self._wake.wait(IDLE_WAIT_S)

    def step(self) -> list[StreamDrafts] | None:
        """Apply what arrived, keep one proposal queued on the device, and answer the tokens of
        the one before: None where nothing was drafted or is being drafted.

        While nothing changes but commits that agree with the drafts, the next proposal extends
        the last one on the device (DraftWorker.extend: no host input), so it is queued before
        the last one's tokens are read and the draft's GPU never waits for this host. A new
        sequence, a release, or a commit that contradicts the drafts starts a new proposal
        (the worker rewinds and commits first), once the one in flight has been read."""
        with self._wake:
            messages = list(self._inbox)
            self._inbox.clear()
        with self.lock:
            if self._closed:  # a Reset may have emptied the worker since the inbox was taken
                return None
            out, inflight, self._inflight = None, self._inflight, None
            if inflight is not None and any(m.release or m.add or m.follow for m in messages):
                # Read first: a release frees cache slots the proposal's tokens are recorded in.
                out, inflight = self._finish(inflight), None
            for message in messages:
                self._changed |= self._apply(message)
            if inflight is not None and not self._changed:
                self._inflight = self._extend(inflight)
            if inflight is not None:
                out = self._finish(inflight)
            if self._inflight is None:
                self._inflight = self._start()
                self._changed = False
            now = time.perf_counter()
            if self._inflight is not None and self._busy_since is None:
                self._busy_since = now
            elif self._inflight is None and self._busy_since is not None:
                self.busy_s += now - self._busy_since
                self._busy_since = None
        if out is None and self._inflight is None:
            return None
        return out or []

    def _start(self) -> "_InFlight | None":
        items = self._items()
        if not any(it.num_tokens for it in items):
            if items:  # committed tokens only: they go with the next proposal
                self._keep_unsent(items)
            return None
        self.calls += 1
        return _InFlight(self.worker.start_propose(ProposeRequest(items=items), extendable=True),
                         [it.seq_id for it in items],
                         [self._followed[it.seq_id].epoch for it in items], [it.num_tokens for it in items])

    def _extend(self, inflight: "_InFlight") -> "_InFlight | None":
        """The proposal after `inflight`, as its continuation on the device, where every
        sequence that should draft more is one it drafts for; else None."""
        drafting = [(seq_id, n) for seq_id, n in zip(inflight.seq_ids, inflight.counts) if n]
        run = [seq_id for seq_id, _ in drafting]
        ahead = {seq_id: self._followed[seq_id].chain_end - self._followed[seq_id].length + n
                 for seq_id, n in drafting}
        wanting = {seq_id for seq_id, seq in self._followed.items()
                   if ahead.get(seq_id, len(seq.drafted)) < self.lookahead}
        if not wanting or not wanting <= set(run):
            return None
        pending = self.worker.extend(run, self.chunk)
        if pending is None:
            return None
        self.calls += 1
        return _InFlight(pending, run, [self._followed[seq_id].epoch for seq_id in run], [self.chunk] * len(run))

    def _finish(self, inflight: "_InFlight") -> list[StreamDrafts]:
        """The tokens of a proposal, for the sequences still on the chain it drafted from."""
        response = inflight.pending.result()
        out = []
        for seq_id, epoch, tokens in zip(inflight.seq_ids, inflight.epochs, response.tokens):
            seq = self._followed.get(seq_id)
            if not tokens or seq is None or seq.epoch != epoch:
                continue
            position = seq.chain_end
            if not seq.extend(tokens):  # a commit that reached past the drafts read contradicts them
                self._changed = True
                continue
            out.append(StreamDrafts(seq_id, epoch, position, tuple(tokens)))
        return out

    def _apply(self, message: StreamControl) -> bool:
        """Returns whether the proposal in flight can no longer be extended (sequences came or
        went, or a commit contradicted drafts)."""
        worker = self.worker
        changed = bool(message.release or message.add or message.follow)
        if message.release:
            for seq_id in message.release:
                self._followed.pop(seq_id, None)
            worker.release(list(message.release))
        if message.add:
            worker.runner.add(message.add)
        for follow in message.follow:
            state = worker.runner.get(follow.seq_id)  # raises for a sequence never added
            self._followed[follow.seq_id] = _Followed(follow.sampling, len(state.committed))
        for commit in message.commits:
            seq = self._followed.get(commit.seq_id)
            if seq is not None:
                epoch = seq.epoch
                seq.commit(tuple(commit.tokens))
                changed |= seq.epoch != epoch
        return changed

    def _items(self) -> list[ProposeItem]:
        """Per followed sequence: what the target committed since the last call, what the draft
        drafted past it (assumed), and `chunk` more tokens where it is not yet `lookahead`
        ahead and the cache has room."""
        items = []
        max_len = self.worker.runner.cache.max_seq_len
        for seq_id, seq in self._followed.items():
            room = max_len - (seq.length + len(seq.drafted)) - 1
            k = self.chunk if len(seq.drafted) < self.lookahead and room >= self.chunk else 0
            if k or seq.unsent:
                items.append(ProposeItem(seq_id, k, tuple(seq.unsent), seq.sampling, tuple(seq.drafted)))
                seq.unsent = []
                seq.restart_at_committed()
        return items

    def _keep_unsent(self, items: list[ProposeItem]) -> None:
        for item in items:
            seq = self._followed[item.seq_id]
            seq.unsent = list(item.committed) + seq.unsent


class LocalDraftStream:
    """A DraftStream over an in-process DraftWorker: the loop on a thread of its own."""

    def __init__(self, worker, first: StreamControl):
        self.mailbox = Mailbox()
        self.loop = StreamingDraft(worker, lookahead=first.lookahead or DEFAULT_LOOKAHEAD,
                                   chunk=first.chunk or DEFAULT_CHUNK)
        self.loop.control(first)
        self._thread = threading.Thread(target=self._run, name="draft-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run(lambda drafts: self.mailbox.put(drafts, self.loop.busy_total()))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator through the mailbox
            log.warning("draft stream failed: %s", exc)
            self.mailbox.fail(exc)
        else:
            self.mailbox.fail(RuntimeError("closed"))

    def send(self, control: StreamControl) -> None:
        if self.loop.closed:
            raise WorkerUnavailableError("draft stream is closed")
        self.loop.control(control)

    def receive(self, timeout_s: float = 0.0):
        return self.mailbox.take(timeout_s)

    @property
    def busy_s(self) -> float:
        return self.mailbox.busy_s

    def close(self) -> None:
        self.loop.close()
        self._thread.join(timeout=10)
