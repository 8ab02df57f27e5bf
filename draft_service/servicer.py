"""bass.v1.DraftWorker over a DraftWorker."""

from __future__ import annotations

from bass.transport import wire
from bass.transport.worker_servicer import WorkerServicerBase
from bass.v1 import worker_pb2_grpc

SERVICE_NAME = "bass.v1.DraftWorker"


class DraftServicer(WorkerServicerBase, worker_pb2_grpc.DraftWorkerServicer):
    service_name = SERVICE_NAME
    step_call = "propose"

    def Propose(self, request, context):
        step = wire.propose_request_from_proto(request)
        with self.lock:
            response = self.worker.propose(step)
        return wire.propose_response_to_proto(response)

    def register(self, server) -> None:
        worker_pb2_grpc.add_DraftWorkerServicer_to_server(self, server)
