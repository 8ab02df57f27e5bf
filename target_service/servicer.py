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

    def register(self, server) -> None:
        worker_pb2_grpc.add_TargetWorkerServicer_to_server(self, server)
