"""The coordinator's end of a draft stream over gRPC (`DraftWorker.Stream` in worker.proto; the
draft's end is draft_service/stream_host.py).

A reader thread puts what arrives into a mailbox the coordinator takes from at each step; sending
never waits for the draft.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque

import grpc

from bass.core.errors import WorkerUnavailableError
from bass.core.worker_api import StreamControl, StreamDrafts
from bass.transport import wire

log = logging.getLogger(__name__)

_END = object()  # put on the request queue: half-close the stream


class Mailbox:
    """Drafts on their way from a stream's loop (or its RPC) to the coordinator's thread."""

    def __init__(self):
        self._items: deque[StreamDrafts] = deque()
        self._ready = threading.Condition()
        self._error: Exception | None = None
        self.busy_s = 0.0  # the draft's time in its proposals, as of the last delivery

    def put(self, drafts: list[StreamDrafts], busy_s: float | None = None) -> None:
        with self._ready:
            self._items.extend(drafts)
            if busy_s is not None:
                self.busy_s = busy_s
            self._ready.notify_all()

    def fail(self, error: Exception) -> None:
        with self._ready:
            self._error = error
            self._ready.notify_all()

    def take(self, timeout_s: float = 0.0) -> list[StreamDrafts]:
        with self._ready:
            if not self._items and self._error is None and timeout_s > 0:
                self._ready.wait(timeout_s)
            if not self._items and self._error is not None:
                raise WorkerUnavailableError(f"draft stream ended: {self._error}")
            out = list(self._items)
            self._items.clear()
            return out


class RemoteDraftStream:
    """The coordinator's end of a draft service's stream (DraftStream in bass/core/worker_api.py)."""

    def __init__(self, stub, address: str, first: StreamControl):
        self.address = address
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put(wire.stream_control_to_proto(first))
        self._replies = stub.Stream(iter(self._requests.get, _END))
        self.mailbox = Mailbox()
        self._closed = False
        threading.Thread(target=self._read, name="bass-draft-stream", daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self._replies:
                self.mailbox.put(wire.stream_drafts_from_proto(message), message.busy_s)
        except grpc.RpcError as e:
            if not self._closed:
                log.warning("draft stream at %s failed: %s %s", self.address, e.code().name, e.details())
            self.mailbox.fail(WorkerUnavailableError(f"draft at {self.address}: stream failed with "
                                                     f"{e.code().name}: {e.details()}"))
        except Exception as exc:  # noqa: BLE001 - a malformed message ends the stream
            self.mailbox.fail(exc)
        else:
            self.mailbox.fail(WorkerUnavailableError(f"draft at {self.address}: the stream ended"))

    def send(self, control: StreamControl) -> None:
        if self._closed:
            raise WorkerUnavailableError(f"draft at {self.address}: the stream is closed")
        self._requests.put(wire.stream_control_to_proto(control))

    def receive(self, timeout_s: float = 0.0) -> list[StreamDrafts]:
        return self.mailbox.take(timeout_s)

    @property
    def busy_s(self) -> float:
        return self.mailbox.busy_s

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._requests.put(_END)
            self._replies.cancel()
