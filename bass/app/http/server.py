"""Serve the front with uvicorn on a socket bound here (so port 0 works and the address is known
before the first request), on a thread of its own: `serve_http` returns once it accepts."""

from __future__ import annotations

import logging
import socket
import threading
import time

from bass.core.config import HttpConfig
from bass.core.errors import InvalidRequestError

log = logging.getLogger(__name__)


class RunningHttp:
    def __init__(self, server, thread: threading.Thread, sock: socket.socket):
        self._server, self._thread, self._socket = server, thread, sock
        host, port = sock.getsockname()[:2]
        self.port = port
        self.address = f"{host}:{port}"

    @property
    def url(self) -> str:
        """The base URL OpenAI clients take (`base_url`)."""
        return f"http://{self.address}/v1"

    def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting; open requests get grace_s (default: the config's shutdown_grace_s), then are cut."""
        if grace_s is not None:
            self._server.config.timeout_graceful_shutdown = grace_s
        self._server.should_exit = True
        self._thread.join()
        self._socket.close()


def serve_http(config: HttpConfig) -> RunningHttp:
    import uvicorn

    from bass.app.http.app import build_app

    if config.port is None:
        raise InvalidRequestError("http.port", "is required to serve the HTTP front")
    if not config.coordinator_address:
        raise InvalidRequestError("http.coordinator_address", "is required (host:port of the coordinator)")
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        sock.close()
        raise InvalidRequestError("http.port", f"cannot serve on {config.host}:{config.port}: {e.strerror or e}") \
            from None
    app = build_app(config)
    server = uvicorn.Server(uvicorn.Config(
        app, http="h11", lifespan="on", log_config=None, access_log=False, log_level="warning",
        timeout_graceful_shutdown=config.shutdown_grace_s))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), name="bass-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sock.close()
            raise RuntimeError("the HTTP front did not start (see the log)")
        time.sleep(0.02)
    running = RunningHttp(server, thread, sock)
    log.info("OpenAI-compatible HTTP front on %s, for the coordinator at %s", running.url, config.coordinator_address)
    return running
