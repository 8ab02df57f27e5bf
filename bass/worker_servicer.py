"""The gRPC face of a model worker: one step at a time, messages converted in bass.wire.

Model calls run on the server's thread pool, serialized by a lock; health checks and Info are
answered from other threads while a step runs. The same calls also arrive as frames on a
long-lived stream (`Session`, bass/worker_session.py), answered by these same handlers.
"""

from __future__ import annotations

import threading

from bass import wire
from bass.v1 import worker_pb2 as pb
from bass.worker_session import serve_session


class WorkerServicerBase:
    service_name: str
    step_call: str  # the body name of the worker's step: "propose" or "verify"

    def __init__(self, worker):
        self.worker = worker
        self.lock = threading.Lock()

    def Session(self, request_iterator, context):
        handlers = {"info": self.Info, "release": self.Release, "reset": self.Reset,
                    self.step_call: getattr(self, self.step_call.capitalize())}
        return serve_session(handlers, request_iterator, context, self.service_name, self.starters())

    def starters(self) -> dict:
        """Session bodies whose pipelined calls may overlap (bass/worker_session.py): none here."""
        return {}

    def Info(self, request, context):
        return wire.info_to_proto(self.worker.info())

    def Release(self, request, context):
        with self.lock:
            self.worker.release(list(request.seq_ids))
            return self._occupancy()

    def Reset(self, request, context):
        with self.lock:
            self.worker.reset()
            return self._occupancy()

    def _occupancy(self) -> pb.ReleaseResponse:
        runner = self.worker.runner
        return pb.ReleaseResponse(active_sequences=len(runner.sequences), free_slots=runner.cache.free_slots)
