"""Start the coordinator: connect to the workers, run the engine, serve bass.v1.Generation."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from bass.coordinator.engine import CoordinatorEngine
from bass.coordinator.metrics import MetricsServer, serve_metrics
from bass.coordinator.servicer import REPLICA_SERVICE_NAME, SERVICE_NAME, GenerationServicer, ReplicaServicer
from bass.coordinator.tokenizer import load_codec
from bass.core.config import CoordinatorConfig
from bass.core.errors import InvalidRequestError
from bass.transport.grpc_server import RunningServer, start_server, wait_for_stop_signal
from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker

log = logging.getLogger(__name__)


@dataclass
class Coordinator:
    server: RunningServer
    engine: CoordinatorEngine
    metrics: MetricsServer | None = None

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop (SIGTERM): health NOT_SERVING at once (load balancers and Kubernetes stop
        sending), new requests UNAVAILABLE, running ones get grace_s (default: the config's
        shutdown_grace_s) to finish and the rest UNAVAILABLE, then the server stops."""
        grace_s = self.engine.config.shutdown_grace_s if grace_s is None else grace_s
        started = time.monotonic()
        self.server.health.enter_graceful_shutdown()
        cut = self.engine.shutdown(grace_s)
        # Every request is answered by now; the second lets the handlers send those answers.
        self.server.stop(1.0)
        if self.metrics is not None:
            self.metrics.stop()
        for worker in (self.engine.target, self.engine.draft):
            if worker is not None:
                worker.close()
        log.info("stopped in %.2f s (%d requests cut short)", time.monotonic() - started, cut)

    def wait_for_signal(self) -> None:
        """Serve until SIGINT/SIGTERM, then stop gracefully."""
        wait_for_stop_signal()
        self.stop()


def serve(config: CoordinatorConfig) -> Coordinator:
    if not config.target_address:
        raise InvalidRequestError("target_address", "is required")
    if config.tokenizer_dir is None:
        raise InvalidRequestError("tokenizer_dir", "is required (the models' tokenizer directory)")
    draft = RemoteDraftWorker(config.draft_address) if config.draft_address else None
    target = RemoteTargetWorker(config.target_address, draft=draft)
    engine = CoordinatorEngine(target, draft, load_codec(config.tokenizer_dir), config).start()
    servicer = GenerationServicer(engine)
    server = start_server([servicer.register, ReplicaServicer(engine).register], [SERVICE_NAME, REPLICA_SERVICE_NAME],
                          host=config.host, port=config.port,
                          max_workers=config.max_concurrent_rpcs, engine=engine,
                          max_receive_bytes=config.max_request_bytes)
    coordinator = Coordinator(server=server, engine=engine)
    if config.metrics_port is not None:
        try:
            coordinator.metrics = serve_metrics(engine.metrics, config.host, config.metrics_port)
        except OSError as exc:
            coordinator.stop(grace_s=0)
            raise InvalidRequestError("metrics_port", f"cannot serve metrics on {config.host}:{config.metrics_port}: "
                                                      f"{exc.strerror or exc}") from None
    return coordinator
