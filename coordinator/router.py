"""`bass router`: one public bass.v1.Generation address in front of several replicas.

A replica is a whole coordinator with its own model pair (continuous batching in each); the
router only picks one per request and passes bytes. Each request goes whole, all n sequences,
to the serving replica with the lowest load (coordinator/replicas.py); the request is decoded
once, for its n, and forwarded as the bytes that came in; answers and stream messages go back
as the bytes that came out, never decoded. The router holds no request state beyond the call
in flight, so any number of routers can front the same replicas.

Failures: a replica that fails a call with UNAVAILABLE before anything reached the client (a
unary answer, or a stream's first message) is taken out, and the request goes to the next
best replica (at most max_retries times); a stream cut after its first message ends with the
replica's UNAVAILABLE. A client's cancel or deadline cancels the upstream call, which frees the
replica's KV slots as a direct call would. Health: SERVING while any replica serves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge

from bass.coordinator.metrics import MetricsServer, serve_metrics
from bass.coordinator.replicas import Replica, ReplicaSet
from bass.coordinator.servicer import SERVICE_NAME
from bass.core.config import RouterConfig
from bass.core.errors import ForwardedError, InvalidRequestError, WorkerUnavailableError
from bass.transport.grpc_server import RunningServer, start_server, wait_for_stop_signal
from bass.v1 import generation_pb2 as pb

log = logging.getLogger(__name__)


class RouterMetrics:
    """Per-replica load as the router last saw it, and what it forwarded where."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        label = ["replica"]
        self.up = Gauge("bass_replica_up", "1 while the replica serves (its last poll said so)", label, registry=r)
        self.running = Gauge("bass_replica_running_sequences", "Sequences in the replica's batch", label,
                             registry=r)
        self.queued = Gauge("bass_replica_queued_sequences", "Sequences of requests queued at the replica", label,
                            registry=r)
        self.kv_slots = Gauge("bass_replica_kv_slots", "The replica target's KV slots", label, registry=r)
        self.in_flight = Gauge("bass_replica_in_flight_sequences", "Sequences this router has forwarded to the "
                               "replica and not yet seen answered", label, registry=r)
        self.requests = Counter("bass_router_requests", "Requests forwarded, by replica and the status it answered "
                                "(lower-case gRPC code: ok, unavailable, invalid_argument, ...)",
                                ["replica", "code"], registry=r)
        self.retries = Counter("bass_router_retries", "Requests sent to another replica after this one failed "
                               "with UNAVAILABLE before answering", label, registry=r)
        self.no_replica = Counter("bass_router_no_replica", "Requests answered UNAVAILABLE: no replica served",
                                  registry=r)

    def replica(self, replica: Replica) -> None:
        with replica.lock:
            load, serving, in_flight, removed = replica.load, replica.serving, replica.in_flight, replica.removed
        labels = (replica.address,)
        if removed:
            for gauge in (self.up, self.running, self.queued, self.kv_slots, self.in_flight):
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass
            return
        self.up.labels(*labels).set(int(serving))
        self.in_flight.labels(*labels).set(in_flight)
        if load is not None:
            self.running.labels(*labels).set(load.running_sequences)
            self.queued.labels(*labels).set(load.queued_sequences)
            self.kv_slots.labels(*labels).set(load.kv_slots)


def _timeout(context) -> float | None:
    """What is left of the client's deadline (None: it set none), for the upstream call."""
    left = context.time_remaining()
    return None if left is None or left > 1e8 else max(left, 0.0)


class GenerationRouter:
    """bass.v1.Generation, forwarded: the handlers take and return bytes."""

    def __init__(self, replicas: ReplicaSet, config: RouterConfig, metrics: RouterMetrics):
        self.replicas, self.config, self.metrics = replicas, config, metrics

    @staticmethod
    def _sequences(raw: bytes) -> int:
        try:
            return pb.GenerateRequest.FromString(raw).n or 1
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's malformed message
            raise InvalidRequestError("request", f"cannot be decoded as a GenerateRequest ({exc})") from None

    def _next(self, n: int, tried: list[Replica], last_error: str) -> Replica:
        replica = self.replicas.choose(n, exclude=tried) if len(tried) <= self.config.max_retries else None
        if replica is None:
            if not tried:
                self.metrics.no_replica.inc()
                known = len(self.replicas.replicas)
                raise WorkerUnavailableError(f"no replica is serving ({known} known); retry later")
            raise WorkerUnavailableError(last_error)
        if tried:
            self.metrics.retries.labels(tried[-1].address).inc()
            log.info("retrying on %s after %s: %s", replica.address, tried[-1].address, last_error)
        tried.append(replica)
        return replica

    def _failure(self, replica: Replica, exc: grpc.RpcError, context, answered: bool) -> str | None:
        """The retry reason for a failed upstream call, or None: pass its status on as it is."""
        code = exc.code()
        self.metrics.requests.labels(replica.address, code.name.lower()).inc()
        if code == grpc.StatusCode.CANCELLED and replica.lost and context.is_active():
            code = grpc.StatusCode.UNAVAILABLE  # cancelled by us: the replica stopped answering
        if code != grpc.StatusCode.UNAVAILABLE:
            raise ForwardedError(code.name, exc.details() or code.name)
        replica.failed(f"a call failed: {exc.details()}")
        reason = f"replica {replica.address} failed: {exc.details() or 'unavailable'}"
        if answered or not context.is_active():
            raise WorkerUnavailableError(reason)
        return reason

    def generate(self, raw: bytes, context) -> bytes:
        n = self._sequences(raw)
        tried: list[Replica] = []
        current: list = [None]
        context.add_callback(lambda: current[0] is not None and current[0].cancel())  # client gone, deadline passed
        reason = ""
        while True:
            replica = self._next(n, tried, reason)
            with replica.forwarding(n) as register:
                call = current[0] = replica.generate.future(raw, timeout=_timeout(context))
                register(call)
                try:
                    answer = call.result()
                except grpc.RpcError as exc:
                    reason = self._failure(replica, exc, context, answered=False)
                    continue
            self.metrics.requests.labels(replica.address, "ok").inc()
            return answer

    def generate_stream(self, raw: bytes, context):
        n = self._sequences(raw)
        tried: list[Replica] = []
        reason = ""
        while True:
            replica = self._next(n, tried, reason)
            sent = 0
            with replica.forwarding(n) as register:
                call = replica.generate_stream(raw, timeout=_timeout(context))
                register(call)
                context.add_callback(call.cancel)
                try:
                    for message in call:
                        sent += 1
                        yield message
                except grpc.RpcError as exc:
                    reason = self._failure(replica, exc, context, answered=sent > 0)
                    continue
                finally:
                    call.cancel()  # a no-op once it ended; frees the replica's slots if the client left
            self.metrics.requests.labels(replica.address, "ok").inc()
            return

    def register(self, server: grpc.Server) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Generate": grpc.unary_unary_rpc_method_handler(self.generate),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(self.generate_stream),
        }),))


@dataclass
class Router:
    server: RunningServer
    replicas: ReplicaSet
    config: RouterConfig
    metrics: RouterMetrics
    metrics_server: MetricsServer | None = None
    _serving: bool | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return self.server.address

    def update_health(self) -> None:
        """bass.v1.Generation's health follows the replicas (a Kubernetes readiness probe);
        the server's own ("") stays SERVING while the process runs (a liveness probe must not
        restart the router because its replicas are loading)."""
        serving = bool(self.replicas.serving())
        if serving != self._serving:
            self._serving = serving
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            self.server.health.set(SERVICE_NAME, status)

    def stop(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, no new calls, forwarded ones get grace_s (default the config's
        shutdown_grace_s) to finish, then the rest are cancelled (their replicas free them)."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        started = time.monotonic()
        self.server.stop(grace_s)
        self.replicas.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        log.info("router stopped in %.2f s", time.monotonic() - started)

    def wait_for_signal(self) -> None:
        wait_for_stop_signal()
        self.stop()


def serve(config: RouterConfig) -> Router:
    """Start the router: its replicas are polled at once, and it answers once each was polled
    (or probe_timeout_s passed), so that its health is right from the start."""
    if not config.replicas and not config.replica_dns:
        raise InvalidRequestError("router.replicas", "name at least one replica (or replica_dns)")
    metrics = RouterMetrics()
    holder: list[Router] = []

    def changed(replica: Replica) -> None:
        metrics.replica(replica)
        if holder:
            holder[0].update_health()

    replicas = ReplicaSet(config, on_change=changed)
    forwarder = GenerationRouter(replicas, config, metrics)
    server = start_server([forwarder.register], [SERVICE_NAME], host=config.host, port=config.port,
                          max_workers=config.max_concurrent_rpcs, engine=replicas,
                          max_receive_bytes=config.max_request_bytes)
    router = Router(server=server, replicas=replicas, config=config, metrics=metrics)
    holder.append(router)
    try:
        replicas.start()
    except OSError as exc:
        router.stop(0)
        raise InvalidRequestError("router.replica_dns", f"cannot resolve {config.replica_dns}: {exc}") from None
    replicas.wait_first_polls(config.probe_timeout_s + 0.5)
    router.update_health()
    if config.metrics_port is not None:
        try:
            router.metrics_server = serve_metrics(metrics, config.host, config.metrics_port)
        except OSError as exc:
            router.stop(0)
            raise InvalidRequestError("router.metrics_port", f"cannot serve metrics on {config.host}:"
                                      f"{config.metrics_port}: {exc.strerror or exc}") from None
    return router
