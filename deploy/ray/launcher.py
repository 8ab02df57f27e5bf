"""`bass up`: place target, draft and coordinator on a Ray cluster; `bass down`: remove them.

One placement group holds a bundle per service (GPUs and CPUs from the [ray] config section);
its strategy decides whether the models share a node (PACK) or spread over nodes (SPREAD). With
`colocate` (the default) the draft runs in the target's actor, on its GPUs (target_gpus; the
bundle takes target_cpus + draft_cpus), and each speculative step is one call. With [http] port
set, the OpenAI-compatible front is one more actor in the coordinator's bundle (which then takes
coordinator_cpus + http_cpus), started once the coordinator serves.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from bass.core.config import ServeConfig
from bass.core.errors import BassError, CapacityError, InvalidRequestError
from bass.deploy.actors import ACTOR_NAMES, ServiceActor

log = logging.getLogger(__name__)

PLACEMENT_GROUP = "bass-services"


def connect(address: str | None, namespace: str) -> None:
    """Join a running Ray cluster (address, or "auto" for the local one)."""
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)


class RayStartError(BassError):
    """A local Ray head could not be started."""


def ray_cli() -> list[str]:
    """The `ray` command of this Python environment: the script beside the interpreter (a venv
    need not be on PATH), else the module itself (installs without scripts, e.g. pip --target)."""
    beside = Path(sys.executable).parent / "ray"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


def start_local_ray(num_gpus: int | None) -> None:
    """`ray start --head` on this machine, so the cluster outlives `bass up`."""
    command = [*ray_cli(), "start", "--head", "--disable-usage-stats"]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RayStartError(f"`{' '.join(command)}` failed ({done.returncode}): "
                            f"{(done.stderr or done.stdout).strip()[-2000:]}")


def _json(config) -> str:
    return json.dumps(asdict(config), default=str)


def up(config: ServeConfig, echo=print, serve_http: Callable | None = None) -> dict[str, str]:
    """Create (or replace) the services; returns their addresses once the coordinator serves (and
    the HTTP front, with [http] port set: `serve_http` starts it in its actor, HttpConfig -> an
    object with `port` and `stop(grace_s)`; `bass up` passes bass.app.http.server.serve_http)."""
    rc = config.ray
    with_http = config.http.port is not None
    if with_http and serve_http is None:
        raise InvalidRequestError("http.port", "is set, but no HTTP front was given to serve it")
    down(rc.namespace)
    with_draft = config.draft is not None and config.draft.model_dir is not None
    colocated = with_draft and config.colocate  # one actor for both models, on the target's GPUs
    bundles = [{"GPU": rc.target_gpus, "CPU": rc.target_cpus + (rc.draft_cpus if colocated else 0)},
               {"CPU": rc.coordinator_cpus + (rc.http_cpus if with_http else 0)}]
    if with_draft and not colocated:
        bundles.insert(1, {"GPU": rc.draft_gpus, "CPU": rc.draft_cpus})
    bundles = [{k: v for k, v in b.items() if v > 0} or {"CPU": 0.01} for b in bundles]
    have = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        need = sum(b.get(resource, 0) for b in bundles)
        if need > have.get(resource, 0):
            raise CapacityError(f"the services need {need:g} {resource}s ([ray] section) but the Ray cluster has "
                                f"{have.get(resource, 0):g}")
    pg = placement_group(bundles, strategy=rc.strategy, name=PLACEMENT_GROUP, lifetime="detached")
    echo(f"waiting for resources: {bundles} ({rc.strategy})")
    ray.get(pg.ready(), timeout=rc.ready_timeout_s)

    def start_json(kind: str, bundle: int, config_json: str, gpus: float, cpus: float, *args):
        return ServiceActor.options(
            name=ACTOR_NAMES[kind], namespace=rc.namespace, lifetime="detached", max_restarts=rc.max_restarts,
            max_task_retries=0, num_gpus=gpus, num_cpus=cpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        ).remote(kind, config_json, *args)

    def start(kind: str, bundle: int, cfg, gpus: float, cpus: float, *args):
        return start_json(kind, bundle, _json(cfg), gpus, cpus, *args)

    target_cfg = replace(config.target, port=rc.target_port)
    if colocated:
        both = json.dumps({"target": asdict(target_cfg), "draft": asdict(config.draft)}, default=str)
        actors = {"colocated": start_json("colocated", 0, both, rc.target_gpus, rc.target_cpus + rc.draft_cpus)}
    else:
        actors = {"target": start("target", 0, target_cfg, rc.target_gpus, rc.target_cpus)}
        if with_draft:
            actors["draft"] = start("draft", 1, replace(config.draft, port=rc.draft_port), rc.draft_gpus,
                                    rc.draft_cpus)
    echo("loading the models...")
    addresses = {kind: ray.get(a.address.remote(), timeout=rc.ready_timeout_s) for kind, a in actors.items()}
    if colocated:
        addresses["target"] = addresses["draft"] = addresses["colocated"]
    coordinator_cfg = replace(config.coordinator, target_address=addresses["target"],
                              draft_address=addresses.get("draft", ""),
                              tokenizer_dir=config.coordinator.tokenizer_dir or config.target.model_dir)
    coordinator = start("coordinator", len(bundles) - 1, coordinator_cfg, 0, rc.coordinator_cpus)
    addresses["coordinator"] = ray.get(coordinator.address.remote(), timeout=rc.ready_timeout_s)
    wait_serving(addresses["coordinator"], timeout_s=rc.ready_timeout_s)
    if with_http:  # the front serves once it listens: it connects to the coordinator per request
        http_cfg = replace(config.http, coordinator_address=config.http.coordinator_address or addresses["coordinator"],
                           tokenizer_dir=config.http.tokenizer_dir or coordinator_cfg.tokenizer_dir)
        http = start("http", len(bundles) - 1, http_cfg, 0, rc.http_cpus, serve_http)  # pickled by reference
        addresses["http"] = ray.get(http.address.remote(), timeout=rc.ready_timeout_s)
    return addresses


def wait_serving(address: str, timeout_s: float, service: str = "bass.v1.Generation") -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} did not pass its health check in {timeout_s:.0f} s")
            time.sleep(0.5)


def placements(namespace: str) -> dict[str, dict]:
    out = {}
    for kind, name in ACTOR_NAMES.items():
        try:
            out[kind] = ray.get(ray.get_actor(name, namespace=namespace).placement.remote(), timeout=30)
        except ValueError:  # no such actor
            pass
    return out


def down(namespace: str) -> list[str]:
    """Stop and remove every service actor and the placement group; returns what was removed."""
    removed = []
    # The front, then the coordinator: no calls to a stopped coordinator or stopped workers.
    for kind in ("http", "coordinator", "draft", "target", "colocated"):
        try:
            actor = ray.get_actor(ACTOR_NAMES[kind], namespace=namespace)
        except ValueError:
            continue
        try:
            ray.get(actor.stop.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - it may be dead already; kill it regardless
            pass
        ray.kill(actor, no_restart=True)
        removed.append(kind)
    try:
        remove_placement_group(ray.util.get_placement_group(PLACEMENT_GROUP))
    except ValueError:
        pass
    return removed
