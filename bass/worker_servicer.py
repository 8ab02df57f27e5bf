"""The gRPC face of a model worker: one step at a time, messages converted in bass.wire.

Model calls run on the server's thread pool, serialized by a lock; health checks and Info are
answered from other threads while a step runs.
"""

from __future__ import annotations

import threading

from bass import wire
from bass.v1 import worker_pb2 as pb


class WorkerServicerBase:
    def __init__(self, worker):
        self.worker = worker
        self.lock = threading.Lock()

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
