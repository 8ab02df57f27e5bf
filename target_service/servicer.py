"""bass.v1.TargetWorker over a TargetWorker."""

from __future__ import annotations

from bass import wire
from bass.v1 import worker_pb2_grpc
from bass.worker_servicer import WorkerServicerBase

SERVICE_NAME = "bass.v1.TargetWorker"


class TargetServicer(WorkerServicerBase, worker_pb2_grpc.TargetWorkerServicer):
    service_name = SERVICE_NAME
    step_call = "verify"

    def Verify(self, request, context):
        step = wire.verify_request_from_proto(request)
        with self.lock:
            response = self.worker.verify(step)
        return wire.verify_response_to_proto(response)

    def starters(self) -> dict:
        """A worker that launches and finishes a Verify separately runs regular steps ahead."""
        return {"verify": self.start_verify} if hasattr(self.worker, "start_verify") else {}

    def start_verify(self, request, context) -> "StartedVerify":
        step = wire.verify_request_from_proto(request)
        with self.lock:
            return StartedVerify(self.lock, self.worker.start_verify(step))

    def register(self, server) -> None:
        worker_pb2_grpc.add_TargetWorkerServicer_to_server(self, server)


class StartedVerify:
    """A Verify launched on the worker (bass.worker_session.StartedCall)."""

    def __init__(self, lock, pending):
        self.lock, self.pending = lock, pending

    def ready(self) -> bool:
        return self.pending.ready()

    def finish(self):
        with self.lock:
            response = self.pending.result()
        return wire.verify_response_to_proto(response)
