"""A worker's calls as frames on one long-lived stream (the `Session` RPC), server side.

Why a stream: a unary call costs the server a new RPC, a hop onto a pool thread and a wait for
its message, each a thread that slept and must wake; on a session the handler thread is already
waiting on the stream when the next frame arrives (issue #13; bench/cpu/rpc_overhead.py measures it).
Each frame is answered by calling the servicer's unary handler of the same name, so both paths
do exactly the same work and fail with the same status codes: a failed call is answered with an
`error` frame carrying that code, and the stream carries on.

Overlapped calls. A worker whose step has two halves (the target: launch, then finish) gives a
*starter* for it. A frame marked `pipelined` (the client may send its next call before reading
this answer) is launched, and while its GPU work runs the loop waits for the next frame; if one
comes first it is launched too, ahead of the first one's answer, so the GPU goes from one step
straight into the next instead of idling through the reply, the client's commit and the next
frame's arrival. Answers still go out one per call, in order. Waiting for a frame while a call
runs needs a read that can be given up on, which gRPC's blocking request iterator is not: a
reader thread makes such reads, one at a time and only when asked, so frames read outside that
wait still come straight to the handler thread, with no hand-off.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Callable, Iterable, Iterator, Mapping, Protocol

from bass.transport.grpc_server import report_failure
from bass.v1 import worker_pb2 as pb

# WorkerCall body -> the WorkerReply field its answer goes in.
REPLY_FIELD = {"info": "info", "propose": "propose", "verify": "verify", "release": "released", "reset": "released",
               "speculate": "speculated"}

Handler = Callable[[object, object], object]  # (request message, context) -> response message

# How often the loop looks at a running call while it waits for the next frame: its answer goes
# out at most this late when no frame comes (the last step of a run).
_POLL_S = 0.0001
_END = object()  # the stream is over


class StartedCall(Protocol):
    def ready(self) -> bool: ...  # its answer can be had without waiting for the GPU
    def finish(self) -> object: ...  # its answer message (raises as the unary handler would)


Starter = Callable[[object, object], StartedCall]  # (request message, context) -> a started call


def serve_session(handlers: Mapping[str, Handler], frames: Iterable[pb.WorkerCall], context,
                  service: str, starters: Mapping[str, Starter] | None = None) -> Iterator[pb.WorkerReply]:
    """Answer each frame, in order, with the handler for its body (`handlers`: body name ->
    unary handler; a body the worker does not serve is answered UNIMPLEMENTED). `starters`:
    body name -> a starter for the bodies whose pipelined calls may overlap."""
    reader = _FrameReader(iter(frames))
    started: deque[tuple[int, str, StartedCall]] = deque()  # launched, unanswered, in order
    starters = starters or {}
    while True:
        if started:
            frame = reader.next_unless(started[0][2].ready)
            if frame is None:  # the oldest call's work is done and no frame came first
                yield _finish(*started.popleft(), service)
                continue
        else:
            frame = reader.next()
        if frame is _END:
            while started:  # the client half-closed the stream: it still gets every answer
                yield _finish(*started.popleft(), service)
            return
        kind = frame.WhichOneof("body")
        starter = starters.get(kind) if frame.pipelined else None
        if starter is None:
            while started:
                yield _finish(*started.popleft(), service)
            yield _answer(handlers, frame, kind, context, service)
            continue
        try:
            call = starter(getattr(frame, kind), context)
        except Exception as exc:  # noqa: BLE001 - answered with its status code, after the calls before it
            while started:
                yield _finish(*started.popleft(), service)
            yield _failed(frame.call_id, kind, exc, service)
            continue
        started.append((frame.call_id, kind, call))
        while len(started) > 1:  # one call runs ahead of another, no further
            yield _finish(*started.popleft(), service)


class _FrameReader:
    """Frames from the request iterator: read on the caller's thread (`next`), or on a reader
    thread while the caller watches something else (`next_unless`). At most one read is ever
    outstanding, so the two never race for the iterator."""

    def __init__(self, frames: Iterator[pb.WorkerCall]):
        self._frames = frames
        self._wanted = threading.Semaphore(0)
        self._read: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = False
        self._thread: threading.Thread | None = None

    def next(self):
        if self._outstanding:
            self._outstanding = False
            return _raised(self._read.get())
        return _raised(self._next_frame())

    def next_unless(self, done: Callable[[], bool]):
        """The next frame, or None if `done()` turns true before one comes (the read stays
        outstanding, for the next call)."""
        if not self._outstanding:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bass-session-reader", daemon=True)
                self._thread.start()
            self._outstanding = True
            self._wanted.release()
        while True:
            try:
                frame = self._read.get(timeout=_POLL_S)
            except queue.Empty:
                if done():
                    return None
            else:
                self._outstanding = False
                return _raised(frame)

    def _next_frame(self):
        """The next frame, _END, or the exception reading raised (a frame that cannot be
        decoded, a cancelled stream), which `next` and `next_unless` raise on the caller's
        thread as the plain iterator would."""
        try:
            return next(self._frames)
        except StopIteration:
            return _END
        except Exception as exc:  # noqa: BLE001 - handed to the handler thread
            return exc

    def _run(self) -> None:
        while True:
            self._wanted.acquire()
            frame = self._next_frame()
            self._read.put(frame)
            if frame is _END or isinstance(frame, Exception):
                return


def _raised(frame):
    if isinstance(frame, Exception):
        raise frame
    return frame


def _answer(handlers: Mapping[str, Handler], frame: pb.WorkerCall, kind: str | None, context,
            service: str) -> pb.WorkerReply:
    handler = handlers.get(kind)
    if handler is None:
        return _error(frame.call_id, 12, f"{service} does not serve {kind or 'an empty call'}")  # UNIMPLEMENTED
    try:
        answer = handler(getattr(frame, kind), context)
    except Exception as exc:  # noqa: BLE001 - answered with its status code, as the unary call would be
        return _failed(frame.call_id, kind, exc, service)
    return pb.WorkerReply(call_id=frame.call_id, **{REPLY_FIELD[kind]: answer})


def _finish(call_id: int, kind: str, call: StartedCall, service: str) -> pb.WorkerReply:
    try:
        answer = call.finish()
    except Exception as exc:  # noqa: BLE001
        return _failed(call_id, kind, exc, service)
    return pb.WorkerReply(call_id=call_id, **{REPLY_FIELD[kind]: answer})


def _failed(call_id: int, kind: str, exc: Exception, service: str) -> pb.WorkerReply:
    code = report_failure(f"/{service}/Session.{kind}", exc)
    return _error(call_id, code.value[0], str(exc) or type(exc).__name__)


def _error(call_id: int, code: int, message: str) -> pb.WorkerReply:
    return pb.WorkerReply(call_id=call_id, error=pb.CallError(code=code, message=message))
