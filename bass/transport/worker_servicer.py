"""The gRPC face of a model worker: one step at a time, messages converted in bass.transport.wire.

Model calls run on the server's thread pool, serialized by a lock; health checks and Info are
answered from other threads while a step runs. The same calls also arrive as frames on a
long-lived stream (`Session`, bass/transport/worker_session.py), answered by these same handlers.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid

from bass.transport import wire
from bass.transport.worker_session import serve_session
from bass.v1 import worker_pb2 as pb


class WorkerServicerBase:
    service_name: str
    step_call: str  # the body name of the worker's step: "propose" or "verify"

    def __init__(self, worker, *, lock: threading.Lock | None = None, instance_id: str | None = None):
        """lock: serializes the model calls (shared by the services of one process);
        instance_id: what Info reports as the serving process (shared likewise)."""
        self.worker = worker
        self.lock = lock or threading.Lock()
        self.instance_id = instance_id or uuid.uuid4().hex

    def session_handlers(self) -> dict:
        """Session body name -> the unary handler that answers it."""
        return {"info": self.Info, "release": self.Release, "reset": self.Reset,
                self.step_call: getattr(self, self.step_call.capitalize())}

    def Session(self, request_iterator, context):
        handlers = self.session_handlers()
        return serve_session(handlers, request_iterator, context, self.service_name, self.starters())

    def starters(self) -> dict:
        """Session bodies whose pipelined calls may overlap (bass/transport/worker_session.py): none here."""
        return {}

    def Info(self, request, context):
        return wire.info_to_proto(dataclasses.replace(self.worker.info(), instance_id=self.instance_id))

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
