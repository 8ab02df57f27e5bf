"""`bass serve`: the target, draft and coordinator services as local processes (the target and
the draft in one process by default: ServeConfig.colocate).

Each child prints one JSON line `{"service": ..., "address": ...}` on stdout once it serves;
the launcher starts the workers, then the coordinator pointed at them (then, with an HTTP port,
the OpenAI-compatible front pointed at the coordinator), prints their addresses, and stops them
together (SIGINT/SIGTERM, or any child exiting).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, replace
from typing import IO, Callable

from bass.core.config import ServeConfig

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600  # loading a model from disk can take minutes on a small CPU


def ready_line(service: str, address: str, **extra: str) -> str:
    """The JSON line a service prints once it serves (e.g. `metrics`: the coordinator's /metrics)."""
    return json.dumps({"service": service, "address": address, **extra})


def _jsonable(config) -> str:
    return json.dumps(asdict(config), default=str)


class ServiceProcess:
    def __init__(self, name: str, args: list[str], stop_timeout_s: float = 10.0):
        self.name = name
        self.stop_timeout_s = stop_timeout_s  # SIGTERM, then SIGKILL if still alive after this
        self.proc = subprocess.Popen([sys.executable, "-m", "bass.cli", *args], stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.address: str | None = None
        self.ready_message: dict = {}

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Read the child's stdout until its ready line; echo other lines."""
        result: dict = {}

        def read(out: IO[str]) -> None:
            for line in out:
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = None
                if isinstance(msg, dict) and msg.get("service") == self.name and "address" in msg:
                    result.update(msg)
                    break
                sys.stderr.write(line)

        reader = threading.Thread(target=read, args=(self.proc.stdout,), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if "address" not in result:
            code = self.proc.poll()
            raise RuntimeError(f"{self.name} service did not become ready"
                               + (f" (exited with {code})" if code is not None else f" in {timeout_s:.0f} s"))
        self.address, self.ready_message = result["address"], result
        return self.address

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def launch(config: ServeConfig, echo: Callable[[str], None] = print) -> list[ServiceProcess]:
    """Start all services; returns them once the coordinator serves (stops all on failure)."""
    started: list[ServiceProcess] = []
    try:
        target_address, draft_address = start_workers(config, started)
        echo(ready_line("target", target_address))
        if draft_address:
            echo(ready_line("draft", draft_address))
        coord_cfg = replace(config.coordinator, target_address=target_address, draft_address=draft_address,
                            tokenizer_dir=config.coordinator.tokenizer_dir or config.target.model_dir)
        # The coordinator lets running requests finish for shutdown_grace_s, then exits within a second.
        coordinator = ServiceProcess("coordinator", ["coordinator", "--config-json", _jsonable(coord_cfg)],
                                     stop_timeout_s=coord_cfg.shutdown_grace_s + 5)
        started.append(coordinator)
        coordinator.wait_ready()
        echo(json.dumps(coordinator.ready_message))
        if config.http.port is not None:  # the OpenAI-compatible front, a client of the coordinator
            http_cfg = replace(config.http, coordinator_address=config.http.coordinator_address or coordinator.address,
                               tokenizer_dir=config.http.tokenizer_dir or coord_cfg.tokenizer_dir)
            http = ServiceProcess("http", ["http-front", "--config-json", _jsonable(http_cfg)],
                                  stop_timeout_s=http_cfg.shutdown_grace_s + 5)
            started.append(http)
            http.wait_ready()
            echo(json.dumps(http.ready_message))
        return started
    except BaseException:
        stop_all(started)
        raise


def start_workers(config: ServeConfig, started: list[ServiceProcess]) -> tuple[str, str]:
    """The model services of `config` as processes, appended to `started` as they start:
    (target address, draft address; "" for none). With `colocate`, one process serves both."""
    with_draft = config.draft is not None and config.draft.model_dir is not None
    if with_draft and config.colocate:
        both = ServiceProcess("target", ["target-service", "--config-json", _jsonable(config.target),
                                         "--draft-config-json", _jsonable(config.draft)])
        started.append(both)
        address = both.wait_ready()
        return address, address
    target = ServiceProcess("target", ["target-service", "--config-json", _jsonable(config.target)])
    started.append(target)
    draft = None
    if with_draft:
        draft = ServiceProcess("draft", ["draft-service", "--config-json", _jsonable(config.draft)])
        started.append(draft)
    return target.wait_ready(), draft.wait_ready() if draft is not None else ""


def stop_all(processes: list[ServiceProcess]) -> None:
    for p in reversed(processes):  # coordinator first, so no request reaches a stopped worker
        p.stop()


def run_until_stopped(processes: list[ServiceProcess]) -> int:
    """Block until a signal or until any service exits; then stop them all."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    while not stop.is_set():
        for p in processes:
            if p.proc.poll() is not None:
                log.error("%s service exited with %s; stopping the others", p.name, p.proc.returncode)
                code = 1
                stop.set()
        stop.wait(0.5)
    stop_all(processes)
    return code
