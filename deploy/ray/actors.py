"""One Ray actor per service, each hosting that service's gRPC server.

Actors are named and detached, so they outlive `bass up` and `bass down` finds them; Ray
restarts one that dies (max_restarts), and since each listens on a fixed port the coordinator
reconnects to the same address (its normal failure handling: regular decoding without the
draft, UNAVAILABLE while the target is away).
"""

from __future__ import annotations

import logging

import ray

# "colocated": the target with the draft in its process (ServeConfig.colocate), in place of both.
# "http": the OpenAI-compatible front, a client of the coordinator (only with [http] port set).
ACTOR_NAMES = {"target": "bass-target", "draft": "bass-draft", "colocated": "bass-models",
               "coordinator": "bass-coordinator", "http": "bass-http"}
ROUTER_NAME = "bass-router"  # with replicas: the router in front of them


def replica_actor_name(kind: str, index: int) -> str:
    """Replica `index`'s actor of that kind (ServeConfig.replicas > 1), e.g. bass-models-0."""
    return f"{ACTOR_NAMES[kind]}-{index}"


@ray.remote
class ServiceActor:
    def __init__(self, kind: str, config_json: str, serve_http=None):
        from pydantic import TypeAdapter

        from bass.core.config import CoordinatorConfig, HttpConfig, RouterConfig, WorkerServiceConfig
        from bass.transport.grpc_server import freeze_startup_heap

        logging.basicConfig(level=logging.INFO)
        self.kind = kind
        if kind == "coordinator":
            from bass.coordinator import server as coordinator_server

            config = TypeAdapter(CoordinatorConfig).validate_json(config_json)
            self.service = coordinator_server.serve(config)
            port = self.service.server.port
        elif kind == "http":
            # serve_http: bass.app.http.server.serve_http (uvicorn on a thread of this actor), handed
            # in by `bass up`: deploy sits below the application shell and imports nothing of it.
            config = TypeAdapter(HttpConfig).validate_json(config_json)
            self.service = serve_http(config)
            port = self.service.port
        elif kind == "router":
            from bass.coordinator import router

            config = TypeAdapter(RouterConfig).validate_json(config_json)
            self.service = router.serve(config)
            port = self.service.port
        elif kind == "colocated":  # config_json: {"target": ..., "draft": ...}
            from bass.target_service.colocated import serve as serve_colocated

            both = TypeAdapter(dict[str, WorkerServiceConfig]).validate_json(config_json)
            config = both["target"]
            self.service = serve_colocated(config, both["draft"])
            port = self.service.port
        else:
            config = TypeAdapter(WorkerServiceConfig).validate_json(config_json)
            if kind == "target":
                from bass.target_service.server import serve
            else:
                from bass.draft_service.server import serve
            self.service = serve(config)
            port = self.service.port
        freeze_startup_heap()  # as the CLI's serving processes do (bass/transport/grpc_server.py)
        host = config.host if config.host not in ("0.0.0.0", "::", "") else ray.util.get_node_ip_address()
        self._address = f"{host}:{port}"

    def address(self) -> str:
        return self._address

    def placement(self) -> dict:
        """Where Ray put this actor, from Ray's own view."""
        ctx = ray.get_runtime_context()
        return {"kind": self.kind, "node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "address": self._address}

    def stop(self, grace_s: float = 5.0) -> None:
        self.service.stop(grace_s)
