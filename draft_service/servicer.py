"""bass.v1.DraftWorker over a DraftWorker."""

from __future__ import annotations

from bass.draft_service.stream_host import StreamHost
from bass.transport import wire
from bass.transport.worker_servicer import WorkerServicerBase
from bass.v1 import worker_pb2_grpc

SERVICE_NAME = "bass.v1.DraftWorker"


class DraftServicer(WorkerServicerBase, worker_pb2_grpc.DraftWorkerServicer):
    service_name = SERVICE_NAME
    step_call = "propose"

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.streams = StreamHost(worker, self.lock)

    def Propose(self, request, context):
        step = wire.propose_request_from_proto(request)
        with self.lock:
            response = self.worker.propose(step)
        return wire.propose_response_to_proto(response)

    def Stream(self, request_iterator, context):
        return self.streams.serve(request_iterator, context)

    def Reset(self, request, context):
        self.streams.stop()  # its loop drafts for the sequences a reset drops
        return super().Reset(request, context)

    def register(self, server) -> None:
        worker_pb2_grpc.add_DraftWorkerServicer_to_server(self, server)
