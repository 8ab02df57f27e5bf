"""The coordinator's engine: the scheduler on its own thread, fed by RPC handler threads.

Handlers call `submit` (validation and tokenization happen on the caller's thread) and read
events from the returned handle: token deltas for streams, then exactly one terminal event
(Done or Failed). The loop thread owns the Scheduler; handlers talk to it only through a
command queue, so no lock guards scheduler state. One small lock guards what handler threads
share with the loop: the count of queued requests (a hard limit, reserved before any work) and
of requests not yet answered (what a graceful shutdown waits for).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Union

from bass.coordinator.metrics import CoordinatorMetrics
from bass.coordinator.requests import FinishReason, GenerationRequest, GenerationResult, check_request_size
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.sequences import RequestRun
from bass.coordinator.tokenizer import Codec
from bass.core.config import CoordinatorConfig
from bass.core.errors import BassError, CapacityError, RequestCancelled, WorkerUnavailableError
from bass.core.worker_api import DraftWorkerAPI, TargetWorkerAPI

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None


@dataclass(frozen=True)
class Done:
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    error: Exception


Event = Union[Delta, Done, Failed]


@dataclass(frozen=True)
class Load:
    """What a router balances replicas by (`Replica/Load`): how full the batch and the queue are
    against what the replica can hold. Read from counters kept anyway, never from the loop."""

    serving: bool  # the target is connected and new requests are accepted
    running_sequences: int  # in the batch after the last step (each holds a KV slot)
    queued_sequences: int  # of requests accepted and not yet admitted
    queued_requests: int
    kv_slots: int  # the target's slots (0 while it is unknown)
    max_batch_size: int
    max_waiting: int
    max_n: int = 0  # sequences one request may ask for (0: not said)


@dataclass
class RequestHandle:
    run: RequestRun
    stream: bool
    events: "queue.Queue[Event]" = field(default_factory=queue.Queue)
    sent_chars: dict[int, int] = field(default_factory=dict)
    closed: bool = False  # a terminal event was sent
    queued: bool = True  # holds a place in the queue (until admitted into the batch, or answered)

    @property
    def n(self) -> int:
        return self.run.request.n

    def __iter__(self):
        """Events until (and including) the terminal one."""
        while True:
            event = self.events.get()
            yield event
            if not isinstance(event, Delta):
                return


class CoordinatorEngine:
    def __init__(self, target: TargetWorkerAPI, draft: DraftWorkerAPI | None, codec: Codec,
                 config: CoordinatorConfig):
        self.target, self.draft, self.codec, self.config = target, draft, codec, config
        self.metrics = CoordinatorMetrics()
        self.scheduler: Scheduler | None = None
        self._commands: "queue.Queue[tuple[str, RequestHandle]]" = queue.Queue()
        self._handles: dict[int, RequestHandle] = {}
        self._waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bass-scheduler", daemon=True)
        # Shared with handler threads (see the module docstring).
        self._lock = threading.Condition()
        self._queued = 0  # requests accepted and not yet admitted into the batch (<= max_waiting)
        self._queued_sequences = 0  # their sequences (a router's measure of the queue)
        self._running = 0  # sequences in the batch after the last step (written by the loop only)
        self._open = 0  # requests accepted and not yet answered
        self._accepting = True
        # The most UTF-8 bytes one token stands for (None: unknown): bounds a text prompt's
        # size before it is tokenized (computed once, here, from the vocabulary).
        self._max_token_bytes: int | None = getattr(codec, "max_token_bytes", None)

    # -- called from RPC threads -------------------------------------------------------------------
    def start(self) -> "CoordinatorEngine":
        self._connect_target()
        self._thread.start()
        return self

    def shutdown(self, grace_s: float) -> int:
        """Stop admitting (new requests get UNAVAILABLE), give the running ones up to grace_s to
        finish, then stop, answering the rest UNAVAILABLE. Returns how many were cut short."""
        deadline = time.monotonic() + grace_s
        with self._lock:
            self._accepting = False
            self._lock.wait_for(lambda: self._open == 0, timeout=max(0.0, deadline - time.monotonic()))
            left = self._open
        if left:
            log.warning("shutting down: %d requests did not finish within %.1f s; answering them UNAVAILABLE",
                        left, grace_s)
        self.stop()
        return left

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and answer every request still open with UNAVAILABLE: handler threads
        wait on their event queues, and a gRPC server's threads are not daemons, so a request
        left unanswered would keep the process from ever exiting."""
        with self._lock:
            self._accepting = False
        self._stop.set()
        self._commands.put(("wake", None))
        self._thread.join(timeout_s)
        if self.scheduler is not None:
            self.scheduler.close()
        gone = WorkerUnavailableError("the coordinator is shutting down; retry (another replica may serve)")
        while True:  # submitted but never seen by the loop
            try:
                kind, handle = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self._close(handle, Failed(gone))
        for handle in list(self._handles.values()):
            self._close(handle, Failed(gone))
        self._handles.clear()

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    @property
    def queued(self) -> int:
        """Requests holding a place in the queue (never more than max_waiting)."""
        return self._queued

    def submit(self, request: GenerationRequest, stream: bool = False) -> RequestHandle:
        scheduler = self.scheduler
        if scheduler is None:
            raise WorkerUnavailableError(f"the target worker at {self.config.target_address} is unavailable")
        # Sizes first: they cost nothing, whereas tokenizing an oversized prompt costs minutes.
        check_request_size(request, scheduler.max_seq_len, self._max_token_bytes, self.config)
        # The place in the queue is taken under the lock, before any work, so that the limit
        # holds however many handler threads submit at once.
        with self._lock:
            if not self._accepting:
                raise WorkerUnavailableError("the coordinator is shutting down; retry (another replica may serve)")
            if self._queued >= self.config.max_waiting:
                raise CapacityError(f"the queue is full ({self.config.max_waiting} requests waiting); retry later")
            self._queued += 1
            self._queued_sequences += request.n
            self._open += 1
        try:
            handle = RequestHandle(run=scheduler.prepare(request), stream=stream)
        except BaseException:
            with self._lock:
                self._queued -= 1
                self._queued_sequences -= request.n
                self._open -= 1
                self._lock.notify_all()
            raise
        self._commands.put(("submit", handle))
        if self._stop.is_set():  # stop() may have drained the commands before this one arrived
            self._close(handle, Failed(WorkerUnavailableError("the coordinator is shutting down")))
        return handle

    def load(self) -> Load:
        """The replica's load now; any thread (a router polls it several times a second)."""
        scheduler = self.scheduler
        with self._lock:
            queued, sequences, accepting = self._queued, self._queued_sequences, self._accepting
        return Load(serving=scheduler is not None and accepting, running_sequences=self._running,
                    queued_sequences=sequences, queued_requests=queued,
                    kv_slots=scheduler.slot_capacity if scheduler is not None else 0,
                    max_batch_size=self.config.scheduler.max_batch_size, max_waiting=self.config.max_waiting,
                    max_n=self.config.scheduler.max_n)

    def cancel(self, handle: RequestHandle) -> None:
        if not handle.closed:
            self._commands.put(("cancel", handle))

    # -- the loop thread -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            scheduler = self.scheduler
            if scheduler is None:
                self._drain_commands(block=True, timeout=self.config.reconnect_interval_s)
                self._connect_target()
                continue
            self._drain_commands(block=not scheduler.has_work, timeout=0.5)
            if not scheduler.has_work:
                self._guarded(scheduler, scheduler.flush_releases)  # free slots while idle
                scheduler.check_draft()
                self._running = 0
                self.metrics.batch(0, 0, scheduler.draft_up)
                continue
            before = replace(scheduler.step_stats)
            finished = self._guarded(scheduler, scheduler.step)
            if finished is not None:
                self.metrics.step(before, scheduler.step_stats)
                self._publish(scheduler, finished)
            self._leave_queue_if_admitted()
            self._waiting = len(scheduler.waiting)
            self._running = len(scheduler.running)
            self.metrics.batch(len(scheduler.running), self._waiting, scheduler.draft_up)

    def _guarded(self, scheduler: Scheduler, call):
        """Run a scheduler call; on failure answer every in-flight request with an error."""
        try:
            return call()
        except WorkerUnavailableError as exc:
            log.error("target failed: %s; failing in-flight requests", exc)
            self._fail(scheduler.fail_all(), exc)
            self.scheduler = None
            self._running = 0
            self.metrics.target_available.set(0)
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the service
            log.exception("step failed; failing in-flight requests")
            self._fail(scheduler.fail_all(), BassError(f"internal error: {exc}"))
            self.scheduler = None  # reconnecting resets both workers
            self._running = 0
        return None

    def _connect_target(self) -> None:
        try:
            info = self.target.info()
            self.target.reset()
        except WorkerUnavailableError as exc:
            log.warning("target unavailable: %s", exc)
            self.metrics.target_available.set(0)
            return
        self.metrics.target_available.set(1)
        log.info("target ready: %s (%d slots)", info.model_name, info.num_slots)
        scheduler = Scheduler(self.target, self.draft, self.codec, self.config.scheduler,
                              reconnect_interval_s=self.config.reconnect_interval_s)
        # The draft's state is known now (the scheduler probed it), not only after a first step.
        self.metrics.draft_available.set(int(scheduler.draft_up))
        self.scheduler = scheduler

    def _drain_commands(self, block: bool, timeout: float) -> None:
        try:
            command = self._commands.get(block=block, timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._apply(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, handle: RequestHandle | None) -> None:
        scheduler = self.scheduler
        if kind == "submit":
            if scheduler is None:
                self._close(handle, Failed(WorkerUnavailableError("the target worker is unavailable")))
                return
            self._handles[id(handle.run)] = handle
            scheduler.enqueue(handle.run)
        elif kind == "cancel" and scheduler is not None and not handle.closed:
            scheduler.cancel(handle.run)
            self._handles.pop(id(handle.run), None)
            self._close(handle, Failed(RequestCancelled("cancelled by the client")))  # wakes the handler
            log.info("request cancelled by its client; %d sequences released", len(handle.run.sequences))

    def _publish(self, scheduler: Scheduler, finished: list[RequestRun]) -> None:
        for handle in list(self._handles.values()):
            run = handle.run
            if handle.stream and run.deltas:
                for index, tokens, reason in run.deltas:
                    handle.events.put(Delta(index, tokens, self._new_text(scheduler, handle, index), reason))
            run.deltas.clear()
        for run in finished:
            handle = self._handles.pop(id(run), None)
            if handle is not None:
                self._close(handle, Done(run.result))

    def _new_text(self, scheduler: Scheduler, handle: RequestHandle, index: int) -> str:
        """Text a sequence gained since its last delta. While it runs, hold back what a stop
        string could still cut (and a trailing partial UTF-8 character), so the streamed
        text always adds up to the final text."""
        seq = handle.run.sequences[index - handle.run.request.first_index]
        sent = handle.sent_chars.get(index, 0)
        if seq.finish_reason is not None:
            text = scheduler.sequence_output(seq).text
            end = len(text)
        else:
            text = seq.text.stable  # ends on a complete character
            hold = max((len(s) for s in handle.run.request.stop), default=1) - 1
            end = len(text) - hold
        if end <= sent:
            return ""
        handle.sent_chars[index] = end
        return text[sent:end]

    def _fail(self, runs: list[RequestRun], error: Exception) -> None:
        for run in runs:
            handle = self._handles.pop(id(run), None)
            if handle is not None:
                self._close(handle, Failed(error))

    def _leave_queue_if_admitted(self) -> None:
        """Give back the queue places of requests the last step admitted into the batch."""
        admitted = [h for h in list(self._handles.values()) if h.queued and h.run.started is not None]
        if admitted:
            with self._lock:
                for handle in admitted:
                    if handle.queued:
                        handle.queued = False
                        self._queued -= 1
                        self._queued_sequences -= handle.n

    def _close(self, handle: RequestHandle, event: Event) -> None:
        # Called from the loop, and from stop() and submit() on other threads: the lock makes
        # "exactly one terminal event" and the counts hold whoever gets here first.
        with self._lock:
            if handle.closed:
                return
            handle.closed = True
            if handle.queued:
                handle.queued = False
                self._queued -= 1
                self._queued_sequences -= handle.n
            self._open -= 1
            self._lock.notify_all()
        handle.events.put(event)
        if isinstance(event, Done):
            self.metrics.request_done(event.result)
        else:
            self.metrics.request_failed(event.error)
