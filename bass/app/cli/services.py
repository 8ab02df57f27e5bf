"""One service per process: `bass target-service`, `bass draft-service`, `bass coordinator`
(what `bass serve`, the Ray actors and the Kubernetes pods run), `bass router` (one address in
front of several coordinators) and `bass http-front` (the OpenAI-compatible HTTP front over a
running coordinator or router)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

import click

from bass.app.cli.options import explicit, fail, load_config, scheduler_options, with_scheduler_options
from bass.core.config import (ATTENTION_BACKENDS, DTYPES, CoordinatorConfig, HttpConfig, RouterConfig,
                              WorkerServiceConfig, resolve_device, resolve_dtype)
from bass.core.errors import BassError


WORKER_OPTIONS = ["model_dir", "host", "port", "device", "dtype", "num_slots", "max_seq_len", "attention"]


def worker_options(f):
    for opt in reversed([
        click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False), help="Model directory."),
        click.option("--host", help="Interface to listen on [127.0.0.1]."),
        click.option("--port", type=int, help="Port [0 = any free port]."),
        click.option("--device", help="cpu | cuda | cuda:N | auto [auto: the GPU where there is one]."),
        click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), help="[auto: bfloat16 on GPU, float32 on CPU]"),
        click.option("--num-slots", type=int, help="KV cache slots (max concurrent sequences) [64]."),
        click.option("--max-seq-len", type=int, help="KV cache positions per sequence [2048]."),
        click.option("--attention", type=click.Choice(ATTENTION_BACKENDS), help="Attention kernel [auto]."),
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
                     help="TOML file; this service's section is used."),
        click.option("--config-json", hidden=True),
    ]):
        f = opt(f)
    return f


def _worker_config(ctx, section: str, extra: list[str] = ()) -> WorkerServiceConfig:
    p = ctx.params
    try:
        cfg = load_config(p["config_file"], p["config_json"], WorkerServiceConfig, section)
        cfg = replace(cfg, **explicit(ctx, WORKER_OPTIONS + list(extra)))
        device = resolve_device(cfg.device)
        return replace(cfg, device=device, dtype=resolve_dtype(cfg.dtype, device))
    except BassError as e:
        fail(e)


def _freeze_startup_heap() -> None:
    from bass.transport.grpc_server import freeze_startup_heap

    freeze_startup_heap()


def _serve_worker(kind: str, cfg: WorkerServiceConfig) -> None:
    from bass.app.launcher import ready_line

    if kind == "target":
        from bass.target_service.server import serve
    else:
        from bass.draft_service.server import serve
    try:
        server = serve(cfg)
    except (BassError, FileNotFoundError, ValueError) as e:
        fail(e)
    _freeze_startup_heap()
    click.echo(ready_line(kind, f"{cfg.host}:{server.port}"))
    server.wait_for_signal()


@click.command("target-service")
@worker_options
@click.option("--batch-invariant", is_flag=True, default=None,
              help="Compute each row the same way whatever the batch (tokens do not move with load; slower).")
@click.option("--draft", "draft_dir", type=click.Path(exists=True, file_okay=False),
              help="Also serve this draft model, from this process and device (bass.v1.DraftWorker on the "
                   "same port): a speculative step is then one call. With --config, its [draft] section.")
@click.option("--draft-top-n", type=int, help="With --draft: the draft's top-k / top-p window [64].")
@click.option("--draft-config-json", hidden=True)
@click.pass_context
def target_service(ctx, draft_dir, draft_top_n, draft_config_json, **_) -> None:
    """Serve the target model (bass.v1.TargetWorker), and with --draft the draft model too."""
    target = _worker_config(ctx, "target", ["batch_invariant"])
    if draft_dir is None and draft_config_json is None:
        _serve_worker("target", target)
        return
    from bass.app.launcher import ready_line
    from bass.target_service.colocated import serve

    try:
        server = serve(target, _colocated_draft_config(ctx, target, draft_dir, draft_top_n, draft_config_json))
    except (BassError, FileNotFoundError, ValueError) as e:
        fail(e)
    _freeze_startup_heap()
    click.echo(ready_line("target", f"{target.host}:{server.port}"))
    server.wait_for_signal()


def _colocated_draft_config(ctx, target: WorkerServiceConfig, draft_dir: str | None, draft_top_n: int | None,
                            draft_config_json: str | None) -> WorkerServiceConfig:
    """The draft's config for `target-service --draft`: its [draft] section (or what `bass serve`
    passed), else the target's cache sizes; always the target's device and dtype."""
    try:
        if draft_config_json or ctx.params["config_file"]:
            base = load_config(ctx.params["config_file"], draft_config_json, WorkerServiceConfig, "draft")
        else:
            base = WorkerServiceConfig(num_slots=target.num_slots, max_seq_len=target.max_seq_len,
                                       attention=target.attention)
        return replace(base, model_dir=draft_dir or base.model_dir, device=target.device, dtype=target.dtype,
                       draft_top_n=draft_top_n or base.draft_top_n)
    except BassError as e:
        fail(e)


@click.command("draft-service")
@worker_options
@click.option("--draft-top-n", type=int, help="The draft finds its top-k / top-p cut among its N most likely tokens [64].")
@click.pass_context
def draft_service(ctx, **_) -> None:
    """Serve the draft model (bass.v1.DraftWorker)."""
    _serve_worker("draft", _worker_config(ctx, "draft", ["draft_top_n"]))


@click.command("coordinator")
@click.option("--target-address", help="host:port of the target service.")
@click.option("--draft-address", help="host:port of the draft service (none: regular decoding).")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="Directory with the models' tokenizer (usually the target's model directory).")
@click.option("--host", help="Interface to listen on [127.0.0.1].")
@click.option("--port", type=int, help="Port of the public Generation service [50051].")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics at http://HOST:PORT/metrics [off].")
@scheduler_options
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--config-json", hidden=True)
@click.pass_context
def coordinator(ctx, **_) -> None:
    """Serve the public Generation API over running draft and target services."""
    from bass.app.launcher import ready_line
    from bass.coordinator.server import serve

    p = ctx.params
    try:
        cfg = load_config(p["config_file"], p["config_json"], CoordinatorConfig, "coordinator")
        cfg = with_scheduler_options(ctx, replace(cfg, **explicit(
            ctx, ["target_address", "draft_address", "tokenizer_dir", "host", "port", "metrics_port"])))
        running = serve(cfg)
    except BassError as e:
        fail(e)
    _freeze_startup_heap()
    metrics = {"metrics": running.metrics.address} if running.metrics else {}
    click.echo(ready_line("coordinator", f"{cfg.host}:{running.server.port}", **metrics))
    running.wait_for_signal()  # returns once every request is answered and the server has stopped
    # Skip the interpreter's teardown: unloading torch and transformers takes ~2 s on a small CPU,
    # which would push the exit past grace + 1 s (Kubernetes SIGKILLs at its own deadline), and
    # there is nothing left to clean up.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@click.command("router")
@click.option("--replica", "replicas", multiple=True,
              help="host:port of a replica's coordinator (repeat for each replica).")
@click.option("--replica-dns", help="host:port whose host resolves to every replica (e.g. a Kubernetes headless "
                                    "Service), looked up again every few seconds.")
@click.option("--host", help="Interface to listen on [127.0.0.1].")
@click.option("--port", type=int, help="Port of the public Generation service [50051].")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics (per-replica load) at "
                                               "http://HOST:PORT/metrics [off].")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML file; its [router] section is used.")
@click.option("--config-json", hidden=True)
@click.pass_context
def router(ctx, **_) -> None:
    """Serve the public Generation API in front of several replicas (coordinators), sending each
    request to the least-loaded one."""
    from bass.app.launcher import ready_line
    from bass.coordinator.router import serve

    p = ctx.params
    try:
        cfg = load_config(p["config_file"], p["config_json"], RouterConfig, "router")
        given = explicit(ctx, ["replica_dns", "host", "port", "metrics_port"])
        if p["replicas"]:
            given["replicas"] = tuple(p["replicas"])
        cfg = replace(cfg, **given)
        running = serve(cfg)
    except BassError as e:
        fail(e)
    metrics = {"metrics": running.metrics_server.address} if running.metrics_server else {}
    click.echo(ready_line("router", f"{cfg.host}:{running.port}", **metrics))
    running.wait_for_signal()


DEFAULT_HTTP_PORT = 8000


@click.command("http-front")
@click.option("--coordinator", "coordinator_address", help="host:port of the coordinator [127.0.0.1:50051].")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="Directory with the models' tokenizer (usually the target's model directory).")
@click.option("--host", help="Interface to listen on [127.0.0.1].")
@click.option("--port", type=int, help=f"HTTP port [{DEFAULT_HTTP_PORT}; 0 = any free port].")
@click.option("--model-name", help="The model id /v1/models lists [the tokenizer directory's name].")
@click.option("--chat-template", type=click.Path(exists=True, dir_okay=False),
              help="A Jinja chat template for /v1/chat/completions [the tokenizer's own].")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML file; its [http] section is used.")
@click.option("--config-json", hidden=True)
@click.pass_context
def http_front(ctx, **_) -> None:
    """Serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /health) over a running coordinator."""
    from bass.app.http.server import serve_http
    from bass.app.launcher import ready_line
    from bass.transport.grpc_server import wait_for_stop_signal

    p = ctx.params
    try:
        cfg = load_config(p["config_file"], p["config_json"], HttpConfig, "http")
        cfg = replace(cfg, **explicit(ctx, ["coordinator_address", "tokenizer_dir", "host", "port", "model_name",
                                            "chat_template"]))
        cfg = replace(cfg, port=DEFAULT_HTTP_PORT if cfg.port is None else cfg.port,
                      coordinator_address=cfg.coordinator_address or "127.0.0.1:50051")
        running = serve_http(cfg)
    except BassError as e:
        fail(e)
    click.echo(ready_line("http", running.address, url=running.url))
    wait_for_stop_signal()
    running.stop()


COMMANDS = [target_service, draft_service, coordinator, router, http_front]
