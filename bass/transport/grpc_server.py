"""What every BASS gRPC server shares: error mapping, health checking, reflection, shutdown.

Servicers stay thin: they convert messages and call an engine object. Exceptions they let
through are mapped to gRPC status codes in one interceptor, so each error type has exactly
one status everywhere.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bass.core.errors import (CapacityError, ForwardedError, InvalidRequestError, PreconditionError, RequestCancelled,
                              UnknownSequenceError, WorkerUnavailableError)

log = logging.getLogger(__name__)

# The internal links between the coordinator and its workers carry whole prompts and compact q
# rows for a batch, hence a large limit. The public API passes its own, smaller receive limit
# (CoordinatorConfig.max_request_bytes) to start_server.
WORKER_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def server_options(max_receive_bytes: int = WORKER_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", WORKER_MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0)]


SERVER_OPTIONS = server_options()


def status_for(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, ForwardedError):  # another server's status, passed on as it was
        code = getattr(grpc.StatusCode, exc.code, grpc.StatusCode.INTERNAL)
        return code if code != grpc.StatusCode.OK else grpc.StatusCode.INTERNAL
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, CapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, UnknownSequenceError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, WorkerUnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, PreconditionError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, RequestCancelled):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.INTERNAL


@dataclass
class RateLimitedLog:
    """At most one log line per `interval_s`, saying how many were left out since the last one:
    what any client can cause (e.g. sending garbage) must not be able to flood the log."""

    interval_s: float = 10.0
    _last: float = -float("inf")
    _suppressed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def warning(self, message: str, *args) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        more = f" ({suppressed} more like it in the last {self.interval_s:.0f} s not logged)" if suppressed else ""
        log.warning(message + more, *args)
        return True


@dataclass(frozen=True)
class _Undecodable:
    """Stands in for a request whose bytes do not parse, so that the handler's guard answers
    INVALID_ARGUMENT with one log line instead of gRPC logging a traceback and answering INTERNAL."""

    error: str


def _tolerant(deserializer: Callable | None) -> Callable | None:
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's malformed message
            return _Undecodable(f"{type(exc).__name__}: {exc}")
    return parse


def report_failure(method: str, exc: Exception) -> grpc.StatusCode:
    """The status an exception from a handler maps to, logged: a traceback only for INTERNAL
    (a bug), one info line for the rest (the caller's error or a known condition)."""
    code = status_for(exc)
    if code == grpc.StatusCode.INTERNAL and not isinstance(exc, ForwardedError):
        log.exception("%s failed", method, exc_info=exc)
    else:
        log.info("%s: %s: %s", method, code.name, exc)
    return code


class _UndecodableFrame(Exception):
    """Raised out of a request stream at a frame that does not parse (see _Undecodable)."""

    def __init__(self, frame: _Undecodable):
        super().__init__(frame.error)
        self.frame = frame


def _decoded(frames: Iterable) -> Iterator:
    for frame in frames:
        if isinstance(frame, _Undecodable):
            raise _UndecodableFrame(frame)
        yield frame


class ErrorInterceptor(grpc.ServerInterceptor):
    """Turn exceptions escaping a handler into a status code and a message."""

    def __init__(self) -> None:
        self.undecodable_log = RateLimitedLog()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        def undecodable(request, context) -> None:
            self.undecodable_log.warning("%s: undecodable request from %s: %s", method, context.peer(),
                                         request.error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: cannot be decoded as the message {method} "
                                                            f"takes ({request.error})")

        def guard(behavior: Callable, streaming: bool):
            def fail(exc: Exception, context):
                context.abort(report_failure(method, exc), str(exc) or type(exc).__name__)

            if streaming:
                def stream(request, context):
                    if isinstance(request, _Undecodable):
                        undecodable(request, context)
                    try:
                        yield from behavior(request, context)
                    except grpc.RpcError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - mapped to a status
                        fail(exc, context)
                return stream

            def unary(request, context):
                if isinstance(request, _Undecodable):
                    undecodable(request, context)
                try:
                    return behavior(request, context)
                except grpc.RpcError:
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    fail(exc, context)
            return unary

        def bidi(behavior: Callable):
            # A request stream (a worker Session): a frame that does not parse ends the stream
            # with INVALID_ARGUMENT, as it ends a unary call.
            def stream(requests, context):
                try:
                    yield from behavior(_decoded(requests), context)
                except grpc.RpcError:
                    raise
                except _UndecodableFrame as exc:
                    undecodable(exc.frame, context)
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    context.abort(report_failure(method, exc), str(exc) or type(exc).__name__)
            return stream

        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(bidi(handler.stream_stream),
                                                         _tolerant(handler.request_deserializer),
                                                         handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(guard(handler.unary_unary, False),
                                                       _tolerant(handler.request_deserializer),
                                                       handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(guard(handler.unary_stream, True),
                                                        _tolerant(handler.request_deserializer),
                                                        handler.response_serializer)
        return handler


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...]
    engine: object = None  # what the servicers are thin over (a worker or the coordinator engine)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls, let in-flight calls finish for up to grace_s, then cancel them."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()

    def wait_for_signal(self, grace_s: float = 5.0) -> None:
        """Block until SIGINT/SIGTERM, then shut down gracefully."""
        wait_for_stop_signal()
        self.stop(grace_s)


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive (torch, transformers, grpc, the models'
    modules and CUDA graphs: over 200k objects after start-up) out of the garbage collector's
    reach. Python's full collections otherwise scan them all, a pause of ~100 ms on a 2-core
    CPU (bench/cpu/gc_pause.py), in the middle of whatever step is running; after this they scan
    only what serving created. Called once a process has loaded and warmed up, before it serves."""
    gc.collect()
    gc.freeze()


def wait_for_stop_signal() -> None:
    """Block (the main thread) until SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")


def start_server(register: Iterable[Callable[[grpc.Server], None]], service_names: Iterable[str], *,
                 host: str = "127.0.0.1", port: int = 0, max_workers: int = 16, engine: object = None,
                 max_receive_bytes: int = WORKER_MAX_MESSAGE_BYTES,
                 thread_setup: Callable[[], None] | None = None) -> RunningServer:
    """Build, bind (port 0 = any free port) and start a server with health and reflection.
    thread_setup runs in each handler thread before its first call (a model service makes its
    device current there: CUDA's current device is per thread)."""
    executor = futures.ThreadPoolExecutor(max_workers=max_workers, initializer=thread_setup)
    server = grpc.server(executor, interceptors=[ErrorInterceptor()],
                         options=server_options(max_receive_bytes))
    names = tuple(service_names)
    for add in register:
        add(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(names + (health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    # host may be a whole `unix:PATH` address: a Unix socket has no port.
    bound = server.add_insecure_port(host if host.startswith("unix:") else f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    for name in ("",) + names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving %s on %s:%d", ", ".join(names), host, bound)
    return RunningServer(server=server, port=bound, health=health_servicer, service_names=names, engine=engine)
