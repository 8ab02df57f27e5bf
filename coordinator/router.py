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
replica's KV slots as a direct call would. Health: bass.v1.Generation SERVING while any replica
serves.

The router is asyncio gRPC (grpc.aio) on a thread of its own: a message passed through costs
a callback on one event loop, where a thread per stream (the synchronous server) cost two
thread wake-ups and saturated at half the messages a second of one replica on a 2-core CPU.
The replicas' polls stay on threads (coordinator/replicas.py), off the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Gauge

from bass.coordinator.metrics import MetricsServer, serve_metrics
from bass.coordinator.replicas import CHANNEL_OPTIONS, GENERATE, GENERATE_STREAM, Replica, ReplicaSet
from bass.coordinator.servicer import SERVICE_NAME
from bass.core.config import RouterConfig
from bass.core.errors import ForwardedError, InvalidRequestError, WorkerUnavailableError
from bass.transport.grpc_server import report_failure, server_options, wait_for_stop_signal
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


def _status_on_error(method: str):
    """Map an exception escaping a handler to its status (bass/transport/grpc_server.py's
    mapping, as every other server has it), for these asyncio handlers."""
    def wrap(handler):
        @functools.wraps(handler)
        async def unary(self, raw, context):
            try:
                return await handler(self, raw, context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                await context.abort(report_failure(method, exc), str(exc) or type(exc).__name__)

        @functools.wraps(handler)
        async def stream(self, raw, context):
            try:
                async for message in handler(self, raw, context):
                    yield message
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                await context.abort(report_failure(method, exc), str(exc) or type(exc).__name__)
        return stream if method.endswith("Stream") else unary
    return wrap


class GenerationRouter:
    """bass.v1.Generation, forwarded: the handlers take and return bytes, on the router's loop."""

    def __init__(self, replicas: ReplicaSet, config: RouterConfig, metrics: RouterMetrics,
                 loop: asyncio.AbstractEventLoop):
        self.replicas, self.config, self.metrics, self.loop = replicas, config, metrics, loop
        self._channels: dict[str, grpc.aio.Channel] = {}  # created and used on the loop only

    def _stubs(self, replica: Replica):
        channel = self._channels.get(replica.address)
        if channel is None:
            channel = self._channels[replica.address] = grpc.aio.insecure_channel(replica.address,
                                                                                  options=CHANNEL_OPTIONS)
        # No serializers: requests and answers pass through as bytes, never decoded here.
        return channel.unary_unary(GENERATE), channel.unary_stream(GENERATE_STREAM)

    async def close_channel(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close(grace=None)

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

    def _failure(self, replica: Replica, exc: BaseException, context, answered: bool) -> str:
        """The retry reason for a failed upstream call; raises to pass its status on instead.
        A call cancelled while this handler was not (CancelledError) was cancelled by the
        replica set: the replica stopped answering."""
        if isinstance(exc, asyncio.CancelledError):
            if asyncio.current_task().cancelling() or not replica.lost:
                raise exc  # the client left (or the server stops): nothing to answer
            code, details = grpc.StatusCode.UNAVAILABLE, f"no answer for {self.config.lost_after_s:g} s"
        else:
            code, details = exc.code(), exc.details()
        self.metrics.requests.labels(replica.address, code.name.lower()).inc()
        if code != grpc.StatusCode.UNAVAILABLE:
            raise ForwardedError(code.name, details or code.name)
        replica.failed(f"a call failed: {details}")
        reason = f"replica {replica.address} failed: {details or 'unavailable'}"
        if answered or context.done():
            raise WorkerUnavailableError(reason)
        return reason

    def _cancel_from_any_thread(self, call) -> Callable[[], None]:
        """How the replica set, on a poller thread, cancels a call of this loop."""
        return lambda: self.loop.call_soon_threadsafe(call.cancel)

    @_status_on_error("/bass.v1.Generation/Generate")
    async def generate(self, raw: bytes, context) -> bytes:
        n = self._sequences(raw)
        tried: list[Replica] = []
        reason = ""
        while True:
            replica = self._next(n, tried, reason)
            unary, _ = self._stubs(replica)
            with replica.forwarding(n) as register:
                call = unary(raw, timeout=_timeout(context))
                register(self._cancel_from_any_thread(call))
                try:
                    answer = await call
                except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
                    reason = self._failure(replica, exc, context, answered=False)
                    continue
                finally:
                    call.cancel()  # a no-op once it ended; frees the replica's slots if the client left
            self.metrics.requests.labels(replica.address, "ok").inc()
            return answer

    @_status_on_error("/bass.v1.Generation/GenerateStream")
    async def generate_stream(self, raw: bytes, context):
        n = self._sequences(raw)
        tried: list[Replica] = []
        reason = ""
        while True:
            replica = self._next(n, tried, reason)
            _, stream = self._stubs(replica)
            sent = 0
            with replica.forwarding(n) as register:
                call = stream(raw, timeout=_timeout(context))
                register(self._cancel_from_any_thread(call))
                try:
                    async for message in call:
                        sent += 1
                        yield message
                except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
                    reason = self._failure(replica, exc, context, answered=sent > 0)
                    continue
                finally:
                    call.cancel()
            self.metrics.requests.labels(replica.address, "ok").inc()
            return

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Generate": grpc.unary_unary_rpc_method_handler(self.generate),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(self.generate_stream),
        })


class _LoopThread:
    """An asyncio event loop on a daemon thread; `run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bass-router", daemon=True)
        self.thread.start()

    def run(self, coro, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def soon(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Router:
    port: int
    host: str
    replicas: ReplicaSet
    config: RouterConfig
    metrics: RouterMetrics
    forwarder: GenerationRouter
    _server: grpc.aio.Server
    _health: health_aio.HealthServicer
    _loop: _LoopThread
    metrics_server: MetricsServer | None = None
    _serving: bool | None = field(default=None, repr=False)
    _health_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def replica_changed(self, replica: Replica) -> None:
        """From the pollers' threads: metrics, health, and a removed replica's channel closed."""
        self.metrics.replica(replica)
        if replica.removed:
            self._loop.soon(self.forwarder.close_channel(replica.address))
        self.update_health()

    def update_health(self) -> None:
        """bass.v1.Generation's health follows the replicas (a Kubernetes readiness probe);
        the server's own ("") stays SERVING while the process runs (a liveness probe must not
        restart the router because its replicas are loading)."""
        with self._health_lock:
            serving = bool(self.replicas.serving())
            if serving == self._serving:
                return
            self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self._loop.soon(self._health.set(SERVICE_NAME, status))

    def stop(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, no new calls, forwarded ones get grace_s (default the config's
        shutdown_grace_s) to finish, then the rest are cancelled (their replicas free them)."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        started = time.monotonic()

        async def shut() -> None:
            await self._health.enter_graceful_shutdown()
            await self._server.stop(grace_s)
            for address in list(self.forwarder._channels):
                await self.forwarder.close_channel(address)
        self._loop.run(shut(), timeout_s=grace_s + 10)
        self.replicas.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self._loop.stop()
        log.info("router stopped in %.2f s", time.monotonic() - started)

    def wait_for_signal(self) -> None:
        wait_for_stop_signal()
        self.stop()


async def _start_server(forwarder: GenerationRouter, config: RouterConfig):
    server = grpc.aio.server(options=server_options(config.max_request_bytes),
                             maximum_concurrent_rpcs=config.max_concurrent_rpcs)
    server.add_generic_rpc_handlers((forwarder.handler(),))
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"cannot listen on {config.host}:{config.port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, health, port


def serve(config: RouterConfig) -> Router:
    """Start the router: its replicas are polled at once, and it answers once each was polled
    (or probe_timeout_s passed), so that its health is right from the start."""
    if not config.replicas and not config.replica_dns:
        raise InvalidRequestError("router.replicas", "name at least one replica (or replica_dns)")
    metrics = RouterMetrics()
    holder: list[Router] = []
    replicas = ReplicaSet(config, on_change=lambda r: holder[0].replica_changed(r) if holder else metrics.replica(r))
    loop = _LoopThread()
    forwarder = GenerationRouter(replicas, config, metrics, loop.loop)
    try:
        server, health, port = loop.run(_start_server(forwarder, config), timeout_s=30)
    except BaseException:
        loop.stop()
        raise
    router = Router(port=port, host=config.host, replicas=replicas, config=config, metrics=metrics,
                    forwarder=forwarder, _server=server, _health=health, _loop=loop)
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
