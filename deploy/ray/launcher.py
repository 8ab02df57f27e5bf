"""`bass up`: place target, draft and coordinator on a Ray cluster; `bass down`: remove them.

One placement group holds a bundle per service (GPUs and CPUs from the [ray] config section);
its strategy decides whether the models share a node (PACK) or spread over nodes (SPREAD). With
`colocate` (the default) the draft runs in the target's actor, on its GPUs (target_gpus; the
bundle takes target_cpus + draft_cpus), and each speculative step is one call. With [http] port
set, the OpenAI-compatible front is one more actor in the coordinator's bundle (which then takes
coordinator_cpus + http_cpus), started once the coordinator serves.

With `replicas` = N > 1, each replica (its model actor or actors and its coordinator) is a
placement group of its own, so Ray puts the N on whichever nodes have the GPUs, one node or
several; a router actor outside them takes the public port and sends each request to the
least-loaded replica (coordinator/router.py); the HTTP front, where asked for, sits beside the
router (http_cpus) and sends its requests through it. Every actor listens on a fixed port, so one that
Ray restarts, on its node or on another after a node is lost, comes back on its address and its
coordinator (or the router) takes it back.
"""

from __future__ import annotations

import functools
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
from bass.deploy.actors import ACTOR_NAMES, ROUTER_NAME, ServiceActor, replica_actor_name

log = logging.getLogger(__name__)

PLACEMENT_GROUP = "bass-services"
REPLICA_PLACEMENT_GROUP = "bass-{namespace}-replica-{index}"  # the namespace: `bass down` removes only its own


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


def _bundles(config: ServeConfig, front_cpus: float = 0.0) -> list[dict[str, float]]:
    """One stack's bundles: the models (one, co-located, or target and draft), then the
    coordinator (with `front_cpus` more for an HTTP front beside it)."""
    rc = config.ray
    colocated = config.with_draft and config.colocate  # one actor for both models, on the target's GPUs
    bundles = [{"GPU": rc.target_gpus, "CPU": rc.target_cpus + (rc.draft_cpus if colocated else 0)},
               {"CPU": rc.coordinator_cpus + front_cpus}]
    if config.with_draft and not colocated:
        bundles.insert(1, {"GPU": rc.draft_gpus, "CPU": rc.draft_cpus})
    return [{k: v for k, v in b.items() if v > 0} or {"CPU": 0.01} for b in bundles]


def _check_capacity(bundles: list[dict[str, float]], copies: int, extra_cpus: float = 0.0) -> None:
    """Fail at once, saying what is missing, where the cluster cannot hold `copies` stacks."""
    have = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        need = copies * sum(b.get(resource, 0) for b in bundles) + (extra_cpus if resource == "CPU" else 0)
        if need > have.get(resource, 0):
            what = "the services need" if copies == 1 else f"{copies} replicas (and the router) need"
            raise CapacityError(f"{what} {need:g} {resource}s ([ray] section) but the Ray cluster has "
                                f"{have.get(resource, 0):g}")


def _wait_placed(pg, name: str, bundles, timeout_s: float) -> None:
    """Wait for a placement group, or say why it is not placed: the whole cluster may have the
    resources while no single node has what a bundle (or a STRICT_PACK group) needs."""
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        nodes = [{k: v for k, v in n.get("Resources", {}).items() if k in ("CPU", "GPU")}
                 for n in ray.nodes() if n.get("Alive")]
        raise CapacityError(f"placement group {name} ({bundles}) was not placed within {timeout_s:.0f} s: no room "
                            f"for it on the nodes alive now, {nodes} (nodes lost, or GPUs held by something else?)"
                            ) from None


def up(config: ServeConfig, echo=print, serve_http: Callable | None = None) -> dict[str, str]:
    """Create (or replace) the services; returns their addresses once the coordinator (or, with
    replicas, the router) serves, and the HTTP front with [http] port set: `serve_http` starts it
    in its actor, HttpConfig -> an object with `port` and `stop(grace_s)`; `bass up` passes
    bass.app.http.server.serve_http (deploy sits below the application shell)."""
    rc = config.ray
    with_http = config.http.port is not None
    if with_http and serve_http is None:
        raise InvalidRequestError("http.port", "is set, but no HTTP front was given to serve it")
    down(rc.namespace)
    if config.replicas > 1:
        try:
            return _up_replicas(config, echo, serve_http if with_http else None)
        except BaseException:  # leave no group pending for resources nor half the replicas running
            down(rc.namespace)
            raise
    warning = config.turn_taking_warning(rc.draft_gpus >= 1)  # a fraction may share the target's GPU
    if warning is not None:
        log.warning(warning)
    bundles = _bundles(config, rc.http_cpus if with_http else 0.0)
    _check_capacity(bundles, 1)
    pg = placement_group(bundles, strategy=rc.strategy, name=PLACEMENT_GROUP, lifetime="detached")
    echo(f"waiting for resources: {bundles} ({rc.strategy})")
    _wait_placed(pg, PLACEMENT_GROUP, bundles, rc.ready_timeout_s)
    actors = _start_models(config, ACTOR_NAMES.__getitem__, rc.target_port, rc.draft_port, pg)
    echo("loading the models...")
    addresses = {kind: ray.get(a.address.remote(), timeout=rc.ready_timeout_s) for kind, a in actors.items()}
    if "colocated" in addresses:  # one actor for both models, on the target's GPUs
        addresses["target"] = addresses["draft"] = addresses["colocated"]
    coordinator_cfg = replace(config.coordinator, target_address=addresses["target"],
                              draft_address=addresses.get("draft", ""),
                              tokenizer_dir=config.coordinator.tokenizer_dir or config.target.model_dir)
    coordinator = _start_actor(rc, ACTOR_NAMES["coordinator"], "coordinator", _json(coordinator_cfg),
                               cpus=rc.coordinator_cpus, group=pg, bundle=len(bundles) - 1)
    addresses["coordinator"] = ray.get(coordinator.address.remote(), timeout=rc.ready_timeout_s)
    wait_serving(addresses["coordinator"], timeout_s=rc.ready_timeout_s)
    if with_http:  # the front serves once it listens: it connects to the coordinator per request
        http = _start_actor(rc, ACTOR_NAMES["http"], "http", _json(_http_config(config, addresses["coordinator"])),
                            serve_http, cpus=rc.http_cpus, group=pg, bundle=len(bundles) - 1)  # pickled by reference
        addresses["http"] = ray.get(http.address.remote(), timeout=rc.ready_timeout_s)
    return addresses


def _http_config(config: ServeConfig, public_address: str):
    """The front's config: pointed at the public gRPC address (the coordinator, or the router)."""
    return replace(config.http, coordinator_address=config.http.coordinator_address or public_address,
                   tokenizer_dir=config.http.tokenizer_dir or config.coordinator.tokenizer_dir
                   or config.target.model_dir)


def _start_actor(rc, name: str, kind: str, config_json: str, *args, cpus: float, gpus: float = 0.0, group=None,
                 bundle: int = 0, beside_router: bool = False):
    """One detached service actor (Ray restarts it, up to max_restarts, on its fixed port): in
    bundle `bundle` of placement group `group`, or, beside_router, on the nodes offering [ray]
    router_resource (where the router and the HTTP front in front of replicas go)."""
    placement = {}
    if group is not None:
        placement["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
    if beside_router and rc.router_resource:
        placement["resources"] = {rc.router_resource: 0.001}
    return ServiceActor.options(name=name, namespace=rc.namespace, lifetime="detached", max_restarts=rc.max_restarts,
                                max_task_retries=0, num_gpus=gpus, num_cpus=cpus, **placement
                                ).remote(kind, config_json, *args)


def _start_models(config: ServeConfig, name_of: Callable[[str], str], target_port: int, draft_port: int,
                  group) -> dict[str, object]:
    """A stack's model actors (loading), on their ports, in the first bundles of `group` (as
    _bundles lays them out): {"colocated": actor} or {"target": ..., "draft": ...}; name_of(kind)
    names each actor."""
    rc = config.ray
    target_cfg = replace(config.target, port=target_port)
    if config.with_draft and config.colocate:
        both = json.dumps({"target": asdict(target_cfg), "draft": asdict(config.draft)}, default=str)
        return {"colocated": _start_actor(rc, name_of("colocated"), "colocated", both, gpus=rc.target_gpus,
                                          cpus=rc.target_cpus + rc.draft_cpus, group=group)}
    actors = {"target": _start_actor(rc, name_of("target"), "target", _json(target_cfg), gpus=rc.target_gpus,
                                     cpus=rc.target_cpus, group=group)}
    if config.with_draft:
        actors["draft"] = _start_actor(rc, name_of("draft"), "draft", _json(replace(config.draft, port=draft_port)),
                                       gpus=rc.draft_gpus, cpus=rc.draft_cpus, group=group, bundle=1)
    return actors


def _up_replicas(config: ServeConfig, echo, serve_http: Callable | None) -> dict[str, str]:
    """N stacks, a placement group each, the router in front, and the HTTP front beside it where
    `serve_http` is given (see the module docstring)."""
    rc, n = config.ray, config.replicas
    bundles = _bundles(config)
    _check_capacity(bundles, n, rc.router_cpus + (rc.http_cpus if serve_http is not None else 0))
    names = [REPLICA_PLACEMENT_GROUP.format(namespace=rc.namespace, index=i) for i in range(n)]
    groups = [placement_group(bundles, strategy=rc.strategy, name=name, lifetime="detached") for name in names]
    echo(f"waiting for resources: {n} replicas x {bundles} ({rc.strategy} within each)")
    for name, pg in zip(names, groups):
        _wait_placed(pg, name, bundles, rc.ready_timeout_s)
    models = [_start_models(config, functools.partial(replica_actor_name, index=i), *rc.replica_ports(i)[:2], pg)
              for i, pg in enumerate(groups)]  # all load at once
    echo(f"loading the models of {n} replicas...")
    addresses: dict[str, str] = {}
    coordinators = []
    for i, actors in enumerate(models):
        found = {kind: ray.get(a.address.remote(), timeout=rc.ready_timeout_s) for kind, a in actors.items()}
        target = found.get("colocated") or found["target"]
        draft = found.get("colocated") or found.get("draft", "")
        for kind, address in found.items():
            addresses[f"{kind}-{i}"] = address
        metrics = config.coordinator.metrics_port
        coordinator_cfg = replace(config.coordinator, target_address=target, draft_address=draft,
                                  port=rc.replica_ports(i)[2],
                                  metrics_port=None if metrics is None else (metrics + 1 + i if metrics else 0),
                                  tokenizer_dir=config.coordinator.tokenizer_dir or config.target.model_dir)
        coordinators.append(_start_actor(rc, replica_actor_name("coordinator", i), "coordinator",
                                         _json(coordinator_cfg), cpus=rc.coordinator_cpus, group=groups[i],
                                         bundle=len(bundles) - 1))
    for i, actor in enumerate(coordinators):
        addresses[f"replica-{i}"] = ray.get(actor.address.remote(), timeout=rc.ready_timeout_s)
    c = config.coordinator
    router_cfg = replace(config.router, replicas=tuple(addresses[f"replica-{i}"] for i in range(n)), replica_dns="",
                         host=c.host, port=c.port, metrics_port=c.metrics_port)
    router = _start_actor(rc, ROUTER_NAME, "router", _json(router_cfg), cpus=rc.router_cpus, beside_router=True)
    addresses["router"] = ray.get(router.address.remote(), timeout=rc.ready_timeout_s)
    for i in range(n):  # every replica serves before `bass up` says the service does
        wait_serving(addresses[f"replica-{i}"], timeout_s=rc.ready_timeout_s)
    wait_serving(addresses["router"], timeout_s=rc.ready_timeout_s)
    if serve_http is not None:
        http = _start_actor(rc, ACTOR_NAMES["http"], "http", _json(_http_config(config, addresses["router"])),
                            serve_http, cpus=rc.http_cpus, beside_router=True)
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


def _our_actors(namespace: str) -> dict[str, str]:
    """{kind: actor name} of every BASS actor in the namespace; kinds of a replica's actors end
    in -i ("coordinator-0", "colocated-1"), the router's is "router"."""
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace}
    found = {kind: name for kind, name in ACTOR_NAMES.items() if name in names}
    if ROUTER_NAME in names:
        found["router"] = ROUTER_NAME
    for kind in ACTOR_NAMES:
        for name in names:
            prefix = ACTOR_NAMES[kind] + "-"
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                found[f"{kind}-{name[len(prefix):]}"] = name
    return found


def placements(namespace: str) -> dict[str, dict]:
    out = {}
    for kind, name in _our_actors(namespace).items():
        try:
            out[kind] = ray.get(ray.get_actor(name, namespace=namespace).placement.remote(), timeout=30)
        except ValueError:  # gone meanwhile
            pass
    return out


def down(namespace: str) -> list[str]:
    """Stop and remove every service actor and the placement groups; returns what was removed."""
    removed = []
    actors = _our_actors(namespace)
    # The HTTP front and the router first, then coordinators: no calls to stopped services.
    order = {"http": 0, "router": 1, "coordinator": 2, "draft": 3, "target": 4, "colocated": 5}
    for kind in sorted(actors, key=lambda k: (order[k.split("-")[0]], k)):
        try:
            actor = ray.get_actor(actors[kind], namespace=namespace)
        except ValueError:
            continue
        try:
            ray.get(actor.stop.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - it may be dead already; kill it regardless
            pass
        ray.kill(actor, no_restart=True)
        removed.append(kind)
    groups = [PLACEMENT_GROUP] + sorted(t["name"] for t in ray.util.placement_group_table().values()
                                        if t.get("name", "").startswith(REPLICA_PLACEMENT_GROUP.split("{index}")[0]
                                                                        .format(namespace=namespace))
                                        and t["state"] != "REMOVED")
    for name in dict.fromkeys(groups):
        try:
            remove_placement_group(ray.util.get_placement_group(name))
        except ValueError:
            pass
    return removed
