"""The draft's end of a draft stream over gRPC (`DraftWorker.Stream` in worker.proto; the
coordinator's end is bass/transport/draft_stream.py).

The handler thread runs the draft's loop (draft_service/stream.py) and yields each call's tokens as
one message; a reader thread hands the coordinator's messages to the loop as they come, so a commit
reaches the draft while it drafts. One stream per draft service: a new stream (or a Reset) ends the
one before, whose loop would otherwise draft for sequences that are gone.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

import grpc

from bass.draft_service.stream import DEFAULT_CHUNK, DEFAULT_LOOKAHEAD, StreamingDraft
from bass.transport import wire
from bass.v1 import worker_pb2 as pb

log = logging.getLogger(__name__)


class StreamHost:
    """A draft service's one running stream (server side)."""

    def __init__(self, worker, lock: threading.Lock):
        self.worker, self.lock = worker, lock
        self._current: StreamingDraft | None = None
        self._guard = threading.Lock()

    def stop(self) -> None:
        """End the running stream, if any (a Reset, or a new stream). A step it is in finishes
        (under `lock`): take `lock` before using the worker."""
        with self._guard:
            loop, self._current = self._current, None
        if loop is not None:
            loop.close()

    def serve(self, requests: Iterator[pb.StreamControl], context) -> Iterator[pb.StreamDrafts]:
        first = next(requests, None)
        if first is None:
            return
        control = wire.stream_control_from_proto(first)
        loop = StreamingDraft(self.worker, lookahead=control.lookahead or DEFAULT_LOOKAHEAD,
                              chunk=control.chunk or DEFAULT_CHUNK, lock=self.lock)
        self.stop()
        with self._guard:
            self._current = loop
        loop.control(control)
        threading.Thread(target=self._read, args=(requests, loop), name="bass-draft-stream-reader",
                         daemon=True).start()
        context.add_callback(loop.close)  # the coordinator went away or cancelled
        log.info("draft stream opened (lookahead %d, chunk %d)", loop.lookahead, loop.chunk)
        try:
            while not loop.closed:
                drafted = loop.step()
                if drafted is None:
                    loop.idle()
                elif drafted:
                    yield wire.stream_drafts_to_proto(drafted, loop.busy_total())
        finally:
            loop.close()
            with self._guard:
                if self._current is loop:
                    self._current = None
            log.info("draft stream closed after %d calls", loop.calls)

    @staticmethod
    def _read(requests: Iterator[pb.StreamControl], loop: StreamingDraft) -> None:
        try:
            for message in requests:
                loop.control(wire.stream_control_from_proto(message))
        except grpc.RpcError:  # the coordinator closed or cancelled the stream
            log.debug("draft stream: cancelled by the coordinator")
        except Exception as exc:  # noqa: BLE001 - a malformed message ends the stream
            log.warning("draft stream: %s", exc)
        finally:
            loop.close()
