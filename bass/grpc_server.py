"""What every BASS gRPC server shares: error mapping, health checking, reflection, shutdown.

Servicers stay thin: they convert messages and call an engine object. Exceptions they let
through are mapped to gRPC status codes in one interceptor, so each error type has exactly
one status everywhere.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bass.errors import (CapacityError, InvalidRequestError, RequestCancelled, UnknownSequenceError,
                         WorkerUnavailableError)

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.so_reuseport", 0)]


def status_for(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, CapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, UnknownSequenceError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, WorkerUnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, RequestCancelled):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.INTERNAL


class ErrorInterceptor(grpc.ServerInterceptor):
    """Turn exceptions escaping a handler into a status code and a message."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        def guard(behavior: Callable, streaming: bool):
            def fail(exc: Exception, context):
                code = status_for(exc)
                if code == grpc.StatusCode.INTERNAL:
                    log.exception("%s failed", method)
                else:
                    log.info("%s: %s: %s", method, code.name, exc)
                context.abort(code, str(exc) or type(exc).__name__)

            if streaming:
                def stream(request, context):
                    try:
                        yield from behavior(request, context)
                    except grpc.RpcError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - mapped to a status
                        fail(exc, context)
                return stream

            def unary(request, context):
                try:
                    return behavior(request, context)
                except grpc.RpcError:
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    fail(exc, context)
            return unary

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(guard(handler.unary_unary, False),
                                                       handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(guard(handler.unary_stream, True),
                                                        handler.request_deserializer, handler.response_serializer)
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

    def wait_for_signal(self, on_stop: Callable[[], None] | None = None, grace_s: float = 5.0) -> None:
        """Block until SIGINT/SIGTERM, then shut down gracefully."""
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        log.info("shutting down")
        if on_stop:
            on_stop()
        self.stop(grace_s)


def start_server(register: Iterable[Callable[[grpc.Server], None]], service_names: Iterable[str], *,
                 host: str = "127.0.0.1", port: int = 0, max_workers: int = 16, engine: object = None) -> RunningServer:
    """Build, bind (port 0 = any free port) and start a server with health and reflection."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=[ErrorInterceptor()],
                         options=SERVER_OPTIONS)
    names = tuple(service_names)
    for add in register:
        add(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(names + (health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    for name in ("",) + names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving %s on %s:%d", ", ".join(names), host, bound)
    return RunningServer(server=server, port=bound, health=health_servicer, service_names=names, engine=engine)
