"""Start the target service: load the model, warm it up, serve bass.v1.TargetWorker."""

from __future__ import annotations

import functools

from bass.core.config import WorkerServiceConfig
from bass.engine.runner import ModelRunner, use_device
from bass.target_service.servicer import SERVICE_NAME, TargetServicer
from bass.target_service.worker import TargetWorker
from bass.transport.grpc_server import RunningServer, start_server


def serve(config: WorkerServiceConfig) -> RunningServer:
    use_device(config.runner_config().device)
    worker = TargetWorker(ModelRunner(config.runner_config()))
    worker.warm_up()
    servicer = TargetServicer(worker)
    return start_server([servicer.register], [SERVICE_NAME], host=config.host, port=config.port,
                        engine=worker, thread_setup=functools.partial(use_device, worker.runner.config.device))
