"""A worker's calls as frames on one long-lived stream (the `Session` RPC), server side.

Why a stream: a unary call costs the server a new RPC, a hop onto a pool thread and a wait for
its message, each a thread that slept and must wake; on a session the handler thread is already
waiting on the stream when the next frame arrives (issue #13; bench/rpc_overhead.py measures it).
Each frame is answered by calling the servicer's unary handler of the same name, so both paths
do exactly the same work and fail with the same status codes: a failed call is answered with an
`error` frame carrying that code, and the stream carries on.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, Mapping

from bass.grpc_server import report_failure
from bass.v1 import worker_pb2 as pb

# WorkerCall body -> the WorkerReply field its answer goes in.
REPLY_FIELD = {"info": "info", "propose": "propose", "verify": "verify", "release": "released", "reset": "released"}

Handler = Callable[[object, object], object]  # (request message, context) -> response message


def serve_session(handlers: Mapping[str, Handler], frames: Iterable[pb.WorkerCall], context,
                  service: str) -> Iterator[pb.WorkerReply]:
    """Answer each frame, in order, with the handler for its body (`handlers`: body name ->
    unary handler; a body the worker does not serve is answered UNIMPLEMENTED).

    gRPC sends what this generator yields and returns to it only once the send is done, so a
    thread that both answers and sends waits out each send before it can read the next frame.
    That is the right order when the client waits for each answer before its next call. A frame
    marked `ahead` says the next call is already coming: then a helper thread reads and answers
    the frames that follow while this one sends, until it answers a frame not marked `ahead`."""
    frames = iter(frames)
    for frame in frames:
        yield _answer(handlers, frame, context, service)
        if frame.ahead and (yield from _answered_by_helper(handlers, frames, context, service)):
            return


_RUN_OVER, _STREAM_OVER = object(), object()  # what the helper hands back with


def _answered_by_helper(handlers, frames: Iterator[pb.WorkerCall], context, service: str):
    """Yields the helper's answers; returns True if the stream ended during the run. One
    thread iterates `frames` at a time: the helper, from here until it hands back."""
    replies: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        try:
            for frame in frames:
                replies.put(_answer(handlers, frame, context, service))
                if not frame.ahead:
                    replies.put(_RUN_OVER)
                    return
            replies.put(_STREAM_OVER)  # the client closed its side
        except BaseException as exc:  # noqa: BLE001 - raised again on the stream's own thread
            replies.put(exc)

    threading.Thread(target=run, name="bass-session-ahead", daemon=True).start()
    while True:
        reply = replies.get()
        if reply is _RUN_OVER or reply is _STREAM_OVER:
            return reply is _STREAM_OVER
        if isinstance(reply, BaseException):
            raise reply
        yield reply


def _answer(handlers: Mapping[str, Handler], frame: pb.WorkerCall, context, service: str) -> pb.WorkerReply:
    kind = frame.WhichOneof("body")
    handler = handlers.get(kind)
    if handler is None:
        return _error(frame.call_id, 12, f"{service} does not serve {kind or 'an empty call'}")  # UNIMPLEMENTED
    try:
        answer = handler(getattr(frame, kind), context)
    except Exception as exc:  # noqa: BLE001 - answered with its status code, as the unary call would be
        code = report_failure(f"/{service}/Session.{kind}", exc)
        return _error(frame.call_id, code.value[0], str(exc) or type(exc).__name__)
    return pb.WorkerReply(call_id=frame.call_id, **{REPLY_FIELD[kind]: answer})


def _error(call_id: int, code: int, message: str) -> pb.WorkerReply:
    return pb.WorkerReply(call_id=call_id, error=pb.CallError(code=code, message=message))
