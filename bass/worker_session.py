"""A worker's calls as frames on one long-lived stream (the `Session` RPC), server side.

Why a stream: a unary call costs the server a new RPC, a hop onto a pool thread and a wait for
its message, each a thread that slept and must wake; on a session the handler thread is already
waiting on the stream when the next frame arrives (issue #13; bench/rpc_overhead.py measures it).
Each frame is answered by calling the servicer's unary handler of the same name, so both paths
do exactly the same work and fail with the same status codes: a failed call is answered with an
`error` frame carrying that code, and the stream carries on.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping

from bass.grpc_server import report_failure
from bass.v1 import worker_pb2 as pb

# WorkerCall body -> the WorkerReply field its answer goes in.
REPLY_FIELD = {"info": "info", "propose": "propose", "verify": "verify", "release": "released", "reset": "released"}

Handler = Callable[[object, object], object]  # (request message, context) -> response message


def serve_session(handlers: Mapping[str, Handler], frames: Iterable[pb.WorkerCall], context,
                  service: str) -> Iterator[pb.WorkerReply]:
    """Answer each frame, in order, with the handler for its body (`handlers`: body name ->
    unary handler; a body the worker does not serve is answered UNIMPLEMENTED)."""
    for frame in frames:
        kind = frame.WhichOneof("body")
        handler = handlers.get(kind)
        if handler is None:
            yield _error(frame.call_id, 12, f"{service} does not serve {kind or 'an empty call'}")  # UNIMPLEMENTED
            continue
        try:
            answer = handler(getattr(frame, kind), context)
        except Exception as exc:  # noqa: BLE001 - answered with its status code, as the unary call would be
            code = report_failure(f"/{service}/Session.{kind}", exc)
            yield _error(frame.call_id, code.value[0], str(exc) or type(exc).__name__)
            continue
        yield pb.WorkerReply(call_id=frame.call_id, **{REPLY_FIELD[kind]: answer})


def _error(call_id: int, code: int, message: str) -> pb.WorkerReply:
    return pb.WorkerReply(call_id=call_id, error=pb.CallError(code=code, message=message))
