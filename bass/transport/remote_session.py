"""The client end of a worker's `Session` stream: calls as frames on one stream, answered in order.

Why (issue #13): a unary call per step pays a new RPC on both ends and a hop onto a pool thread
on the server; on the stream the server's handler thread is already waiting for the next frame.
bench/cpu/rpc_overhead.py measures both.

The caller's thread reads the replies itself (no reader thread: every extra thread in the
chain is one more that sleeps and must be woken). A reply iterator has no timeout, so a watchdog
thread cancels the stream when a call has waited longer than its timeout; it checks a few times
per timeout and is never woken by the calls themselves.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

import grpc

from bass.v1 import worker_pb2 as pb

_END = object()  # put on the request queue: half-close the stream


class SessionError(Exception):
    """The call failed: `code` is the gRPC status it would have ended a unary call with."""

    def __init__(self, code: grpc.StatusCode, details: str, stream_ended: bool):
        super().__init__(details)
        self.code, self.details, self.stream_ended = code, details, stream_ended


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Session:
    """Calls may be sent ahead of earlier replies (`send`, then `result` per call, in the order
    sent): the worker answers frames in order, so a call sent while the previous one runs
    waits in the worker's stream, not on this end's round trip."""

    def __init__(self, session_method, timeout_s: float):
        self.timeout_s = timeout_s
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies = session_method(iter(self._requests.get, _END))
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._unanswered: list[int] = []  # call ids sent and not yet answered, in order
        self._early: dict[int, pb.WorkerReply] = {}  # answers read before their caller asked
        self._discarded: set[int] = set()  # calls whose answers nobody will read
        self._waiting_since: float | None = None
        self._closed = threading.Event()
        self._timed_out = False
        self.ended = False  # the stream is over: open a new Session
        threading.Thread(target=self._watch, name="bass-session-watchdog", daemon=True).start()

    def send(self, kind: str, message, pipelined: bool = False) -> int:
        """Queue one call (`kind`: the WorkerCall body); returns its id for `result`.
        pipelined: the next call may be sent before this one's answer is read (WorkerCall)."""
        with self._send_lock:
            if self.ended:
                raise SessionError(grpc.StatusCode.UNAVAILABLE, "the session has ended", True)
            call_id = next(self._ids)
            self._unanswered.append(call_id)
            self._requests.put(pb.WorkerCall(call_id=call_id, pipelined=pipelined, **{kind: message}))
            return call_id

    def discard(self, call_id: int) -> None:
        """Nobody will ask for this call's answer: drop it when it comes."""
        with self._read_lock:
            if self._early.pop(call_id, None) is None and call_id in self._unanswered:
                self._discarded.add(call_id)

    def result(self, call_id: int):
        """The answer's message to call `call_id` (raises SessionError); answers to calls sent
        before it are kept for their own `result`."""
        with self._read_lock:
            reply = self._early.pop(call_id, None)
            while reply is None:
                if self.ended:
                    raise SessionError(grpc.StatusCode.UNAVAILABLE, "the session has ended", True)
                answer = self._read()
                if answer.call_id in self._discarded:
                    self._discarded.discard(answer.call_id)
                elif answer.call_id == call_id:
                    reply = answer
                else:
                    self._early[answer.call_id] = answer
        body = reply.WhichOneof("body")
        if body == "error":
            raise SessionError(_CODES.get(reply.error.code, grpc.StatusCode.UNKNOWN), reply.error.message, False)
        return getattr(reply, body)

    def _read(self) -> pb.WorkerReply:
        self._waiting_since = time.monotonic()
        try:
            reply = next(self._replies)
        except grpc.RpcError as e:
            self.ended = True
            if self._timed_out:
                raise SessionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"no answer within {self.timeout_s:g} s", True) from None
            raise SessionError(e.code(), e.details() or "", True) from None
        except StopIteration:
            self.ended = True
            raise SessionError(grpc.StatusCode.UNAVAILABLE, "the worker ended the session", True) from None
        finally:
            self._waiting_since = None
        expected = self._unanswered[0] if self._unanswered else None
        if reply.call_id != expected:  # the worker answers in order; never use a stray answer
            self.close()
            raise SessionError(grpc.StatusCode.INTERNAL, f"answer to call {reply.call_id}, expected {expected}", True)
        self._unanswered.pop(0)
        return reply

    def close(self) -> None:
        self.ended = True
        self._closed.set()
        self._requests.put(_END)
        self._replies.cancel()

    def _watch(self) -> None:
        while not self._closed.wait(min(1.0, self.timeout_s / 4)):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self._timed_out = True
                self._replies.cancel()  # wakes the waiting caller with CANCELLED
                return
