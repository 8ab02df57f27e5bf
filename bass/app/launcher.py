"""`bass serve`: the target, draft and coordinator services as local processes (the target and
the draft in one process by default: ServeConfig.colocate).

Each child prints one JSON line `{"service": ..., "address": ...}` on stdout once it serves;
the launcher starts the workers, then the coordinator pointed at them (then, with an HTTP port,
the OpenAI-compatible front pointed at the coordinator), prints their addresses, and stops them
together (SIGINT/SIGTERM, or any child exiting).

With `replicas` > 1 it starts that many copies of the workers and coordinator (replica i's
workers on the i-th visible GPU, through CUDA_VISIBLE_DEVICES), their coordinators on free
ports, and `bass router` on the public port in front of them (the HTTP front then points at the
router). A replica's process that exits is started again on its address, where its coordinator
(for a worker) or the router (for a coordinator) picks it up again; the others keep serving.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from typing import Callable

from bass.core.config import ServeConfig, WorkerServiceConfig, same_device
from bass.core.errors import CapacityError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600  # loading a model from disk can take minutes on a small CPU


def ready_line(service: str, address: str, **extra: str) -> str:
    """The JSON line a service prints once it serves (e.g. `metrics`: the coordinator's /metrics)."""
    return json.dumps({"service": service, "address": address, **extra})


def _jsonable(config) -> str:
    return json.dumps(asdict(config), default=str)


class ServiceProcess:
    """One service as a child process. `restart_args` (replicas only): the arguments that start
    it again on the port it had, given that port; without it, its exit stops everything."""

    def __init__(self, name: str, args: list[str], stop_timeout_s: float = 10.0, env: dict[str, str] | None = None,
                 restart_args: Callable[[int], list[str]] | None = None, label: str | None = None):
        self.name = name
        self.label = label or name
        self.stop_timeout_s = stop_timeout_s  # SIGTERM, then SIGKILL if still alive after this
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.restart_args = restart_args
        self.restarts = 0
        self.proc = self._spawn(args)
        self.address: str | None = None
        self.ready_message: dict = {}

    def _spawn(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "bass.cli", *args], stdout=subprocess.PIPE, text=True,
                                env=self.env)

    def _read_until_ready(self, result: dict) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict) and msg.get("service") == self.name and "address" in msg:
                result.update(msg)
                break
            sys.stderr.write(line)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Read the child's stdout until its ready line; echo other lines."""
        result: dict = {}
        reader = threading.Thread(target=self._read_until_ready, args=(result,), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if "address" not in result:
            code = self.proc.poll()
            raise RuntimeError(f"{self.label} service did not become ready"
                               + (f" (exited with {code})" if code is not None else f" in {timeout_s:.0f} s"))
        self.address, self.ready_message = result["address"], result
        return self.address

    def restart(self) -> None:
        """Start it again on its address, without waiting for it: what depends on it reconnects."""
        port = int(self.address.rpartition(":")[2])
        self.restarts += 1
        self.proc = self._spawn(self.restart_args(port))
        threading.Thread(target=self._read_until_ready, args=({},), daemon=True).start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def public_address(processes: list[ServiceProcess]) -> str:
    """Where clients connect: the router in front of replicas, else the coordinator."""
    names = {p.name: p for p in processes}
    return (names.get("router") or names["coordinator"]).address


def draft_on_own_gpu(config: ServeConfig) -> bool:
    """Whether `bass serve` puts the draft on another GPU than the target's."""
    if not config.with_draft:
        return False
    target, draft = config.target.device, config.draft.device
    return target.startswith("cuda") and draft.startswith("cuda") and not same_device(target, draft)


def launch(config: ServeConfig, echo: Callable[[str], None] = print) -> list[ServiceProcess]:
    """Start all services; returns them once the coordinator (or the router) serves (stops all
    on failure)."""
    if config.replicas > 1:
        return launch_replicas(config, echo)
    warning = config.turn_taking_warning(draft_on_own_gpu(config))
    if warning is not None:
        log.warning(warning)
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
        _start_http(config, coordinator.address, coord_cfg.tokenizer_dir, started, echo)
        return started
    except BaseException:
        stop_all(started)
        raise


def _start_http(config: ServeConfig, address: str, tokenizer_dir, started: list[ServiceProcess], echo) -> None:
    """The OpenAI-compatible front, a client of the public address (with an HTTP port only)."""
    if config.http.port is None:
        return
    http_cfg = replace(config.http, coordinator_address=config.http.coordinator_address or address,
                       tokenizer_dir=config.http.tokenizer_dir or tokenizer_dir)
    http = ServiceProcess("http", ["http-front", "--config-json", _jsonable(http_cfg)],
                          stop_timeout_s=http_cfg.shutdown_grace_s + 5)
    started.append(http)
    http.wait_ready()
    echo(json.dumps(http.ready_message))


def replica_gpus(replicas: int, device: str) -> list[str | None]:
    """Replica i's CUDA_VISIBLE_DEVICES: the i-th GPU this process sees (None on the CPU).
    Each replica is one GPU; more replicas than GPUs is an error, not GPUs shared."""
    if not device.startswith("cuda"):
        return [None] * replicas
    if device != "cuda":
        raise CapacityError(f"replicas: each replica takes a GPU of its own; set device = \"cuda\" "
                            f"(not {device!r}) and choose the GPUs with CUDA_VISIBLE_DEVICES")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
    else:
        import torch

        gpus = [str(i) for i in range(torch.cuda.device_count())]
    if replicas > len(gpus):
        raise CapacityError(f"{replicas} replicas need {replicas} GPUs (one each); this machine shows {len(gpus)}")
    return gpus[:replicas]


def launch_replicas(config: ServeConfig, echo: Callable[[str], None] = print) -> list[ServiceProcess]:
    """N copies of the model workers and the coordinator, and the router on the public port."""
    started: list[ServiceProcess] = []
    tokenizer_dir = config.coordinator.tokenizer_dir or config.target.model_dir
    try:
        gpus = replica_gpus(config.replicas, config.target.device)
        if config.draft is not None and not config.colocate and config.target.device.startswith("cuda"):
            raise CapacityError("replicas: each replica is one GPU with the draft in the target's process "
                                "(colocate = true); the separate draft is not replicated")
        # Every replica's models load at the same time (minutes on a GPU machine, each on its GPU).
        workers = [_replica_workers(config, i, gpu) for i, gpu in enumerate(gpus)]
        for processes in workers:
            started.extend(processes)
        coordinators = []
        for i, processes in enumerate(workers):
            addresses = [p.wait_ready() for p in processes]
            target_address = addresses[0]
            draft_address = addresses[-1] if config.with_draft else ""  # co-located: the target's own address
            for p in processes:
                echo(json.dumps({**p.ready_message, "replica": i}))
            coord_cfg = replace(config.coordinator, target_address=target_address, draft_address=draft_address,
                                tokenizer_dir=tokenizer_dir, port=0,
                                metrics_port=None if config.coordinator.metrics_port is None else 0)
            coordinators.append(_restartable("coordinator", i, coord_cfg, ["coordinator"],
                                             stop_timeout_s=coord_cfg.shutdown_grace_s + 5))
            started.append(coordinators[-1])
        for i, coordinator in enumerate(coordinators):
            coordinator.wait_ready()
            echo(json.dumps({**coordinator.ready_message, "service": "replica", "replica": i}))
        c = config.coordinator
        router_cfg = replace(config.router, replicas=tuple(p.address for p in coordinators), replica_dns="",
                             host=c.host, port=c.port, metrics_port=c.metrics_port)
        router = ServiceProcess("router", ["router", "--config-json", _jsonable(router_cfg)],
                                stop_timeout_s=router_cfg.shutdown_grace_s + 5)
        started.append(router)
        router.wait_ready()
        echo(json.dumps(router.ready_message))
        _start_http(config, router.address, tokenizer_dir, started, echo)
        return started
    except BaseException:
        stop_all(started)
        raise


def _restartable(name: str, index: int, cfg, args: list[str], env: dict | None = None, extra=None,
                 stop_timeout_s: float = 10.0) -> ServiceProcess:
    """A replica's process, started again on the same port if it exits. extra: more arguments
    after the config, given the port (the co-located draft's config)."""
    def command(port: int) -> list[str]:
        return [*args, "--config-json", _jsonable(replace(cfg, port=port)), *(extra or [])]
    return ServiceProcess(name, command(cfg.port), env=env, restart_args=command, label=f"replica {index} {name}",
                          stop_timeout_s=stop_timeout_s)


def _replica_workers(config: ServeConfig, index: int, gpu: str | None) -> list[ServiceProcess]:
    """Replica `index`'s model processes, started (not yet ready) on any free ports, on its GPU."""
    env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else None
    return [_restartable(name, index, replace(cfg, port=0), [command], env, extra=extra)
            for name, command, cfg, extra in _worker_specs(config)]


def _worker_specs(config: ServeConfig) -> list[tuple[str, str, object, list[str]]]:
    """The model services' processes as (name, `bass` sub-command, its config, more arguments):
    the target with the draft in its process (colocate), or the target and the draft apart."""
    if config.with_draft and config.colocate:
        return [("target", "target-service", config.target, ["--draft-config-json", _jsonable(config.draft)])]
    return [("target", "target-service", config.target, []),
            *([("draft", "draft-service", config.draft, [])] if config.with_draft else [])]


def start_workers(config: ServeConfig, started: list[ServiceProcess]) -> tuple[str, str]:
    """The model services of `config` as processes, appended to `started` as they start:
    (target address, draft address; "" for none). With `colocate`, one process serves both."""
    processes = []
    for name, command, cfg, extra in _worker_specs(config):
        processes.append(ServiceProcess(name, [command, "--config-json", _jsonable(cfg), *extra]))
        started.append(processes[-1])  # stopped by the caller should the next one fail to start
    addresses = [p.wait_ready() for p in processes]
    return addresses[0], addresses[-1] if config.with_draft else ""


def start_draft_worker(config: WorkerServiceConfig, started: list[ServiceProcess]) -> str:
    """Only the draft's service, as a process appended to `started` (its coordinator holds the
    target in its own process): its address."""
    process = ServiceProcess("draft", ["draft-service", "--config-json", _jsonable(config)])
    started.append(process)
    return process.wait_ready()


def stop_all(processes: list[ServiceProcess]) -> None:
    for p in reversed(processes):  # coordinator first, so no request reaches a stopped worker
        p.stop()


RESTART_MIN_INTERVAL_S = 5.0  # a replica process that keeps dying is started at most this often


def run_until_stopped(processes: list[ServiceProcess]) -> int:
    """Block until a signal or until any service exits; then stop them all. A replica's
    process (restart_args) is started again instead, and the others keep serving."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    last_start: dict[int, float] = {}
    while not stop.is_set():
        for p in processes:
            if p.proc.poll() is None:
                continue
            if p.restart_args is None:
                log.error("%s service exited with %s; stopping the others", p.label, p.proc.returncode)
                code = 1
                stop.set()
            elif time.monotonic() - last_start.get(id(p), -RESTART_MIN_INTERVAL_S) >= RESTART_MIN_INTERVAL_S:
                log.error("%s exited with %s; starting it again on %s", p.label, p.proc.returncode, p.address)
                last_start[id(p)] = time.monotonic()
                p.restart()
        stop.wait(0.5)
    stop_all(processes)
    return code
