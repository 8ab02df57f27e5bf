"""`bass router`: one public bass.v1.Generation address in front of several replicas.

A replica is a whole coordinator with its own model pair (continuous batching in each); the
router picks replicas and passes bytes. A request goes whole, all n sequences, to the serving
replica with the lowest load (coordinator/replicas.py); the request is decoded once, for its n,
and forwarded as the bytes that came in; answers and stream messages go back as the bytes that
came out, never decoded. A request of several sequences is split instead where two or more
replicas have room (router.split_min_sequences): each part is a request of its own, and the
parts' answers are decoded and merged (coordinator/request_split.py says how). The router
holds no request state beyond the calls in flight, so any number of routers can front the same
replicas.

Failures (of a request, or of one part of a split one; any part's failure that is passed on
fails the request and cancels the other parts): a replica's answer is passed on as it is,
with two exceptions, for the statuses that say "not this replica, not now" rather than anything
about the request: UNAVAILABLE (the
replica is down or shutting down; it is taken out until a poll finds it serving) and
RESOURCE_EXHAUSTED (its queue is full, max_waiting, or its server's concurrent-call limit; it
is chosen after every replica with room until its next poll). A call failed with one of them
before anything reached the client (a unary answer, or a stream's first message) goes to the
next best replica, never one already tried for this request, at most max_retries times. When
none is left: RESOURCE_EXHAUSTED if every replica tried said its queue was full (the message
says so, and what each said), UNAVAILABLE otherwise. A stream cut after its first message ends
with the replica's own status: tokens reached the client, and a second replica would start over.
Every other status is the request's or the replica's answer to it, the same on any replica:
INVALID_ARGUMENT (the request's fault), DEADLINE_EXCEEDED and CANCELLED (the client's deadline
or cancel), INTERNAL and UNKNOWN (a bug; retrying a request that crashes a replica would crash
the next), and RESOURCE_EXHAUSTED for a message over a size limit ("larger than max"): passed
on at once. A client's cancel or deadline cancels the upstream call, which frees the replica's
KV slots as a direct call would. Health: bass.v1.Generation SERVING while any replica serves.

Metadata: the client's (a request id, any x-... key, binary -bin keys) goes to the replica, and
the replica's initial and trailing metadata come back, all but what belongs to one hop: HTTP/2
pseudo headers (":path", ...), the keys gRPC keeps for itself ("grpc-...": each channel sets
grpc-timeout, grpc-encoding, ... for its own call) and the transport's own headers (user-agent,
te, content-type, ...). The deadline goes up as the upstream call's timeout: what is left of it.

The router is asyncio gRPC (grpc.aio) on a thread of its own: a message passed through costs
a callback on one event loop, where a thread per stream (the synchronous server) cost two
thread wake-ups and saturated at half the messages a second of one replica on a 2-core CPU.
The replicas' polls stay on threads (coordinator/replicas.py), off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from bass.coordinator.request_split import Part, StreamMerge, merge_answers, split_request
from bass.coordinator.servicer import SERVICE_NAME
from bass.core.config import RouterConfig
from bass.core.errors import CapacityError, ForwardedError, InvalidRequestError, WorkerUnavailableError
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
                               "with UNAVAILABLE or RESOURCE_EXHAUSTED before answering", label, registry=r)
        self.no_replica = Counter("bass_router_no_replica", "Requests answered UNAVAILABLE: no replica served",
                                  registry=r)
        self.split = Counter("bass_router_split_requests", "Requests split over several replicas, by the number "
                             "of parts (router.split_min_sequences)", ["parts"], registry=r)

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


# Statuses that say "not this replica, not now": the request goes to another (module docstring).
RETRY_ELSEWHERE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})

# Metadata keys of one hop, never forwarded either way (any key starting ":" or "grpc-" too): the
# transport's own headers, which each channel sets for itself. (grpc.aio hands a server user-agent
# among the client's keys; the others are refused or replaced by a channel if passed, or are
# HTTP/1 hop-by-hop headers a proxy drops.)
HOP_KEYS = frozenset({"user-agent", "te", "content-type", "content-length", "host", "connection", "keep-alive",
                      "proxy-connection", "transfer-encoding", "upgrade"})


def forwardable(metadata) -> tuple[tuple[str, str | bytes], ...]:
    """The pairs of a call's metadata that travel past this hop."""
    return tuple((key, value) for key, value in (metadata or ())
                 if not key.startswith((":", "grpc-")) and key not in HOP_KEYS)


def _too_large(code: grpc.StatusCode, details: str) -> bool:
    """gRPC's own RESOURCE_EXHAUSTED for a message over a size limit: the message's, not a full queue."""
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details


async def _pass_back(call, context, initial: bool) -> None:
    """The replica's initial metadata (before the first answer) or trailing metadata, to the client."""
    if initial:
        metadata = forwardable(await call.initial_metadata())
        if metadata:
            await context.send_initial_metadata(metadata)
    else:
        metadata = forwardable(await call.trailing_metadata())
        if metadata:
            context.set_trailing_metadata(metadata)


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


async def _all(coroutines) -> list:
    """Each coroutine's result, in order; the first to fail cancels the others (their upstream
    calls: the replicas free the slots) and its exception is raised."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await _cancelled(tasks)


async def _cancelled(tasks) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


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
    def _decode(raw: bytes) -> pb.GenerateRequest:
        try:
            return pb.GenerateRequest.FromString(raw)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's malformed message
            raise InvalidRequestError("request", f"cannot be decoded as a GenerateRequest ({exc})") from None

    def _parts(self, request: pb.GenerateRequest) -> list[tuple[Part, Replica]]:
        """The request's parts and the replica each goes to first, where it is split (at least
        split_min_sequences sequences, two or more replicas with room); [] where it goes whole."""
        n = request.n or 1
        if not self.config.split_min_sequences or n < self.config.split_min_sequences:
            return []
        replicas = self.replicas.spread(n)
        if not replicas:
            return []
        self.metrics.split.labels(str(len(replicas))).inc()
        return list(zip(split_request(request, len(replicas)), replicas))

    def _next(self, n: int, tried: list[Replica], refusals: list[tuple[grpc.StatusCode, str]],
              first: Replica | None = None) -> Replica:
        """The replica to send the request to next (`first` on the first try, while it serves);
        raises the status to answer when none is left (none serves, every serving one was tried,
        or max_retries is spent)."""
        if not tried and first is not None and first.serving:
            replica = first
        else:
            replica = self.replicas.choose(n, exclude=tried) if len(tried) <= self.config.max_retries else None
        if replica is None:
            known = len(self.replicas.replicas)
            if not tried:
                self.metrics.no_replica.inc()
                raise WorkerUnavailableError(f"no replica is serving ({known} known); retry later")
            said = "; ".join(reason for _, reason in refusals)
            if all(code == grpc.StatusCode.RESOURCE_EXHAUSTED for code, _ in refusals):
                raise CapacityError(f"every replica tried is full ({len(tried)} of {known} known); retry later: {said}")
            raise WorkerUnavailableError(said)
        if tried:
            self.metrics.retries.labels(tried[-1].address).inc()
            log.info("retrying on %s after %s: %s", replica.address, tried[-1].address, refusals[-1][1])
        tried.append(replica)
        return replica

    def _failure(self, replica: Replica, exc: BaseException, context, answered: bool,
                 refusals: list[tuple[grpc.StatusCode, str]]) -> None:
        """Note why a replica did not take the request, to try the next one; raises to pass its
        status on instead (any status but RETRY_ELSEWHERE's, or once the client has an answer).
        A call cancelled while this handler was not (CancelledError) was cancelled by the
        replica set: the replica stopped answering."""
        trailing: tuple = ()
        if isinstance(exc, asyncio.CancelledError):
            if asyncio.current_task().cancelling() or not replica.lost:
                raise exc  # the client left (or the server stops): nothing to answer
            code, details = grpc.StatusCode.UNAVAILABLE, f"no answer for {self.config.lost_after_s:g} s"
        else:
            code, details = exc.code(), exc.details() or ""
            trailing = forwardable(exc.trailing_metadata())
        self.metrics.requests.labels(replica.address, code.name.lower()).inc()
        retry = code in RETRY_ELSEWHERE and not _too_large(code, details)
        if code == grpc.StatusCode.UNAVAILABLE:
            replica.failed(f"a call failed: {details}")
        elif retry and not answered:
            replica.refused(details)  # a full queue refuses a request before its first answer
        if not retry or answered or context.done():
            if trailing:
                context.set_trailing_metadata(trailing)
            if code == grpc.StatusCode.UNAVAILABLE:
                raise WorkerUnavailableError(f"replica {replica.address} failed: {details or 'unavailable'}")
            raise ForwardedError(code.name, details or code.name)
        said = "failed" if code == grpc.StatusCode.UNAVAILABLE else "is full"
        refusals.append((code, f"replica {replica.address} {said}: {details or code.name}"))

    def _cancel_from_any_thread(self, call) -> Callable[[], None]:
        """How the replica set, on a poller thread, cancels a call of this loop."""
        return lambda: self.loop.call_soon_threadsafe(call.cancel)

    @contextlib.contextmanager
    def _forwarding(self, replica: Replica, n: int, method, raw: bytes, context, metadata):
        """The call to `replica`, counted in its load while it runs, cancellable by the replica
        set (a replica lost), and cancelled on the way out (a no-op once it ended; if the client
        left, it frees the replica's slots)."""
        with replica.forwarding(n) as register:
            call = method(raw, timeout=_timeout(context), metadata=metadata)
            register(self._cancel_from_any_thread(call))
            try:
                yield call
            finally:
                call.cancel()

    async def _answered(self, replica: Replica, call, context, initial_sent: bool, metadata_back: bool) -> None:
        self.metrics.requests.labels(replica.address, "ok").inc()
        if not metadata_back:
            return
        if not initial_sent:
            await _pass_back(call, context, initial=True)
        await _pass_back(call, context, initial=False)

    async def _unary(self, raw: bytes, n: int, context, metadata, first: Replica | None = None,
                     metadata_back: bool = True) -> bytes:
        """One request (or part) forwarded, retried elsewhere as the module docstring says."""
        tried: list[Replica] = []
        refusals: list[tuple[grpc.StatusCode, str]] = []
        while True:
            replica = self._next(n, tried, refusals, first)
            with self._forwarding(replica, n, self._stubs(replica)[0], raw, context, metadata) as call:
                try:
                    answer = await call
                except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
                    self._failure(replica, exc, context, answered=False, refusals=refusals)
                    continue
            await self._answered(replica, call, context, initial_sent=False, metadata_back=metadata_back)
            return answer

    async def _stream(self, raw: bytes, n: int, context, metadata, first: Replica | None = None,
                      metadata_back: bool = True):
        """One request's (or part's) stream forwarded; retried elsewhere only before its first
        message (a part's own: the client has none of its sequences' tokens yet)."""
        tried: list[Replica] = []
        refusals: list[tuple[grpc.StatusCode, str]] = []
        while True:
            replica = self._next(n, tried, refusals, first)
            sent = 0
            with self._forwarding(replica, n, self._stubs(replica)[1], raw, context, metadata) as call:
                try:
                    async for message in call:
                        if not sent and metadata_back:  # this replica answers: its initial metadata goes first
                            await _pass_back(call, context, initial=True)
                        sent += 1
                        yield message
                except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
                    self._failure(replica, exc, context, answered=sent > 0, refusals=refusals)
                    continue
            await self._answered(replica, call, context, initial_sent=sent > 0, metadata_back=metadata_back)
            return

    @_status_on_error("/bass.v1.Generation/Generate")
    async def generate(self, raw: bytes, context) -> bytes:
        request = self._decode(raw)
        metadata = forwardable(context.invocation_metadata())
        parts = self._parts(request)
        if not parts:
            return await self._unary(raw, request.n or 1, context, metadata)
        # The first part's replica's metadata comes back (its initial metadata with the answer).
        answers = await _all([self._unary(part.raw, part.n, context, metadata, replica, metadata_back=i == 0)
                              for i, (part, replica) in enumerate(parts)])
        return merge_answers([pb.GenerateResponse.FromString(a) for a in answers]).SerializeToString()

    @_status_on_error("/bass.v1.Generation/GenerateStream")
    async def generate_stream(self, raw: bytes, context):
        request = self._decode(raw)
        metadata = forwardable(context.invocation_metadata())
        parts = self._parts(request)
        if not parts:
            async for message in self._stream(raw, request.n or 1, context, metadata):
                yield message
            return
        # The parts' messages in the order they arrive. No replica's metadata comes back: the
        # first message may be any part's, and initial metadata must precede it.
        merge = StreamMerge()
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(part: Part, replica: Replica) -> None:
            # Closed however the task ends, so that a cancelled part cancels its upstream call.
            async with contextlib.aclosing(self._stream(part.raw, part.n, context, metadata, replica,
                                                        metadata_back=False)) as messages:
                async for message in messages:
                    queue.put_nowait(message)

        tasks = [asyncio.ensure_future(pump(part, replica)) for part, replica in parts]
        for task in tasks:
            task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            for _ in tasks:
                while (message := await queue.get()) is not None:
                    if (passed := merge.pass_on(message)) is not None:
                        yield passed
                failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
                if failed is not None:
                    raise failed.exception()
            yield merge.closing()
        finally:
            await _cancelled(tasks)

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
