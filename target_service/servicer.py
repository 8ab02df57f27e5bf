"""bass.v1.TargetWorker over a TargetWorker."""

from __future__ import annotations

from bass.core.errors import PreconditionError
from bass.transport import wire
from bass.transport.worker_servicer import WorkerServicerBase
from bass.v1 import worker_pb2_grpc

SERVICE_NAME = "bass.v1.TargetWorker"


class TargetServicer(WorkerServicerBase, worker_pb2_grpc.TargetWorkerServicer):
    service_name = SERVICE_NAME
    step_call = "verify"

    def __init__(self, worker, *, speculation=None, **kwargs):
        """speculation: the Speculate calls of a draft in this process (target_service/colocated.py)."""
        super().__init__(worker, **kwargs)
        self.speculation = speculation

    def session_handlers(self) -> dict:
        return {**super().session_handlers(), "speculate": self.Speculate}

    def Speculate(self, request, context):
        if self.speculation is None:
            raise PreconditionError("this target has no draft in its process: call the draft's Propose, then Verify")
        step = wire.speculate_request_from_proto(request)
        with self.lock:
            response = self.speculation.run(step)
        return wire.speculate_response_to_proto(response)

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
    """A Verify launched on the worker (bass.transport.worker_session.StartedCall)."""

    def __init__(self, lock, pending):
        self.lock, self.pending = lock, pending

    def ready(self) -> bool:
        return self.pending.ready()

    def finish(self):
        with self.lock:
            response = self.pending.result()
        return wire.verify_response_to_proto(response)
