"""Start the draft service: load the model, warm it up, serve bass.v1.DraftWorker."""

from __future__ import annotations

import functools

from bass.core.config import WorkerServiceConfig
from bass.draft_service.servicer import SERVICE_NAME, DraftServicer
from bass.draft_service.worker import DraftWorker
from bass.engine.runner import ModelRunner, use_device
from bass.transport.grpc_server import RunningServer, start_server


def serve(config: WorkerServiceConfig) -> RunningServer:
    use_device(config.runner_config().device)
    worker = DraftWorker(ModelRunner(config.runner_config().as_draft()), top_n=config.draft_top_n)
    worker.warm_up()
    servicer = DraftServicer(worker)
    return start_server([servicer.register], [SERVICE_NAME], host=config.host, port=config.port,
                        engine=worker, thread_setup=functools.partial(use_device, worker.runner.config.device))
