"""The whole system at once: `bass serve` (local processes), `bass up` / `bass down` (Ray
actors), `bass demo` (`make demo`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from bass.app.cli.options import fail, scheduler_options, with_scheduler_options
from bass.core.config import (DTYPES, ServeConfig, WorkerServiceConfig, load_config_file, resolve_device, resolve_dtype,
                              same_device)
from bass.core.errors import BassError


def default_model_pair() -> tuple[Path, Path]:
    """(draft, target) directories made by `make models`."""
    from bass.app.models.fetch import default_model_dirs

    return default_model_dirs()


def _require_model(path: Path, what: str) -> Path:
    if not (Path(path) / "config.json").is_file():
        raise click.UsageError(f"no {what} model at {path}: run `make models` (or pass --{what} DIR)")
    return Path(path)


def serve_options(f):
    """The model and service flags of `bass serve`; `bass bench serve --serve` takes the same."""
    for opt in reversed([
        click.option("--target", "target_dir", type=click.Path(file_okay=False),
                     help="Target model directory [the bundled 1.5B from `make models`]."),
        click.option("--draft", "draft_dir", type=click.Path(file_okay=False),
                     help="Draft model directory [the bundled 0.5B]; 'none' for regular decoding only."),
        click.option("--port", type=int, help="Public port of the coordinator [50051]."),
        click.option("--metrics-port", type=int, help="Serve the coordinator's Prometheus metrics on this port [off]."),
        click.option("--http-port", type=int, help="Also serve the OpenAI-compatible HTTP API on this port "
                                                   "(0 = any free port) [off]."),
        click.option("--device", help="cpu | cuda | auto [auto]."),
        click.option("--draft-device", help="The draft's device, e.g. cuda:1: a GPU of its own, in a process of "
                                            "its own (implies --separate-draft) [the target's]."),
        click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), help="[auto: bfloat16 on GPU, float32 on CPU]"),
        click.option("--num-slots", type=int, help="KV cache slots per model [64]."),
        click.option("--max-seq-len", type=int, help="KV cache positions per sequence [2048]."),
        click.option("--batch-invariant", is_flag=True, default=None,
                     help="Target computes each row the same way whatever the batch: seeded and greedy "
                          "tokens do not move with load (slower)."),
        click.option("--lookup-tail", type=int,
                     help="Lookup tokens the target verifies after each co-located draft's proposal, "
                          "continued from the sequence's own text (0-6: at most 7 - k at one sequence, 6 at "
                          "two, 2 at three or four; 0 = off; unused with a draft process of its own) [6]."),
        click.option("--replicas", type=int, help="Copies of the model pair and coordinator (a GPU each) behind "
                                                  "one router on --port [1: no router]."),
        click.option("--separate-draft", is_flag=True, default=None,
                     help="Run the draft in a process of its own (it can fail or restart alone; a "
                          "speculative step then makes two calls instead of one) [off: in the target's]."),
        scheduler_options,
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
                     help="TOML with [target], [draft], [coordinator] sections (see README)."),
    ]):
        f = opt(f)
    return f


def serve_config(ctx: click.Context, default_port: int | None = None) -> ServeConfig:
    """The ServeConfig that serve_options' flags (over a --config file) describe."""
    p = ctx.params
    cfg = load_config_file(Path(p["config_file"])) if p["config_file"] else ServeConfig()
    workers = {k: p[k] for k in ("num_slots", "max_seq_len") if p[k] is not None}
    dev = resolve_device(p["device"] or cfg.target.device)
    dt = resolve_dtype(p["dtype"] or cfg.target.dtype, dev)
    target = replace(cfg.target, device=dev, dtype=dt, **workers,
                     model_dir=_require_model(p["target_dir"] or cfg.target.model_dir or default_model_pair()[1],
                                              "target"))
    if p["batch_invariant"]:
        target = replace(target, batch_invariant=True)
    if p["lookup_tail"] is not None:
        target = replace(target, lookup_tail=p["lookup_tail"])
    draft = None
    if p["draft_dir"] != "none":
        base = cfg.draft or WorkerServiceConfig()
        draft_dev = p["draft_device"] or (base.device if base.device != "auto" else dev)
        draft = replace(base, device=resolve_device(draft_dev), dtype=dt, **workers,
                        model_dir=_require_model(p["draft_dir"] or base.model_dir or default_model_pair()[0], "draft"))
    coord = with_scheduler_options(ctx, cfg.coordinator)
    port = p["port"] if p["port"] is not None else default_port
    coord = replace(coord, **{k: v for k, v in dict(port=port, metrics_port=p["metrics_port"]).items()
                              if v is not None})
    http = cfg.http if p.get("http_port") is None else replace(cfg.http, port=p["http_port"])
    # A draft on a device of its own runs in a process of its own (a co-located pair shares one).
    own_device = p["draft_device"] is not None and draft is not None and not same_device(draft.device, target.device)
    return ServeConfig(target=target, draft=draft, coordinator=coord, http=http, router=cfg.router,
                       replicas=cfg.replicas if p["replicas"] is None else p["replicas"],
                       colocate=cfg.colocate and not p["separate_draft"] and not own_device)


@click.command("serve")
@serve_options
@click.pass_context
def serve(ctx, **_) -> None:
    """Start target, draft and coordinator locally and stop them together (the draft in the
    target's process unless --separate-draft)."""
    from bass.app.launcher import launch, public_address, run_until_stopped

    try:
        processes = launch(serve_config(ctx), echo=click.echo)
    except BassError as e:
        fail(e)
    served = {p.name: p for p in processes}
    where = public_address(processes) + (f" and {served['http'].ready_message['url']}" if "http" in served else "")
    click.echo(f"BASS is serving on {where} (Ctrl-C stops all services)", err=True)
    raise SystemExit(run_until_stopped(processes))


@click.command("up")
@click.option("--ray-address", help="Ray cluster to join (ray://host:10001 or host:6379); none: start a local one.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML with [target], [draft], [coordinator] and [ray] sections (see README).")
@click.option("--target", "target_dir", type=click.Path(file_okay=False), help="[the bundled 1.5B]")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False), help="[the bundled 0.5B]; 'none' to skip")
@click.option("--num-gpus", type=int, help="GPUs of the local Ray started when no --ray-address is given.")
@click.option("--http-port", type=int, help="Also serve the OpenAI-compatible HTTP API on this port, as an actor "
                                            "beside the coordinator (0 = any free port) [[http] port: off].")
@click.option("--replicas", type=int, help="Copies of the model pair and coordinator, a placement group each, "
                                           "behind one router on the coordinator's port [the config's, 1].")
def up(ray_address, config_file, target_dir, draft_dir, num_gpus, http_port, replicas) -> None:
    """Start target, draft and coordinator (N replicas of them behind a router with --replicas;
    the HTTP front with --http-port or [http] port) as Ray actors, placed as [ray] says; print the
    public addresses."""
    try:
        from bass.deploy import launcher
    except ImportError:
        raise click.UsageError("bass up needs Ray: pip install 'bass-serving[ray]'") from None
    try:
        cfg = load_config_file(Path(config_file)) if config_file else ServeConfig()
        device = resolve_device(cfg.target.device)
        target = replace(cfg.target, device=device, dtype=resolve_dtype(cfg.target.dtype, device),
                         model_dir=_require_model(target_dir or cfg.target.model_dir or default_model_pair()[1], "target"))
        draft = None
        if draft_dir != "none" and cfg.draft is not None:
            draft = replace(cfg.draft, device=device, dtype=resolve_dtype(cfg.draft.dtype, device),
                            model_dir=_require_model(draft_dir or cfg.draft.model_dir or default_model_pair()[0], "draft"))
        # Hosts come from the config: 127.0.0.1 (the default) suits one node; set host = "0.0.0.0" in
        # each section for a cluster of several nodes (actors then advertise their node's address).
        cfg = replace(cfg, target=target, draft=draft, replicas=cfg.replicas if replicas is None else replicas,
                      http=cfg.http if http_port is None else replace(cfg.http, port=http_port))
        if not ray_address:
            launcher.start_local_ray(num_gpus)
        launcher.connect(ray_address, cfg.ray.namespace)
        from bass.app.http.server import serve_http

        addresses = launcher.up(cfg, echo=lambda m: click.echo(m, err=True), serve_http=serve_http)
    except BassError as e:
        fail(e)
    urls = {"http": f"http://{addresses['http']}/v1"} if "http" in addresses else {}
    for kind, address in addresses.items():
        click.echo(json.dumps({"service": kind, "address": address, **({"url": urls[kind]} if kind in urls else {})}))
    public = addresses.get("router") or addresses["coordinator"]
    where = public + (f" and {urls['http']}" if urls else "")
    click.echo(f"BASS is serving on {where} (stop it with `bass down`)", err=True)


@click.command("down")
@click.option("--ray-address", help="Ray cluster the services run on [the local one].")
@click.option("--namespace", default="bass", show_default=True)
@click.option("--stop-ray", is_flag=True, help="Also stop the local Ray that `bass up` started (`ray stop`: it stops "
                                                "every Ray process of this user on this machine).")
def down(ray_address, namespace, stop_ray) -> None:
    """Stop the services `bass up` started."""
    import subprocess

    from bass.deploy import launcher

    try:
        launcher.connect(ray_address, namespace)
    except ConnectionError as e:
        click.echo(f"no Ray cluster to stop services on ({e})", err=True)
    else:
        removed = launcher.down(namespace)
        click.echo(f"stopped: {', '.join(removed) or 'nothing was running'}")
    if stop_ray:
        subprocess.run([*launcher.ray_cli(), "stop"], check=False, capture_output=True)


@click.command("demo")
@click.option("--target", "target_dir", type=click.Path(file_okay=False), help="[the bundled 1.5B]")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False), help="[the bundled 0.5B]")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True)
@click.option("-n", "n", default=8, show_default=True)
@click.option("--max-new-tokens", type=int, help="[32 on CPU, 128 on GPU]")
def demo(target_dir, draft_dir, device, dtype, n, max_new_tokens) -> None:
    """Serve the bundled pair and run one real multi-sequence request (what `make demo` runs)."""
    from bass.app.demo import run_demo

    device = resolve_device(device)
    target = _require_model(target_dir or default_model_pair()[1], "target")
    draft = _require_model(draft_dir or default_model_pair()[0], "draft")
    run_demo(target, draft, device, resolve_dtype(dtype, device), n,
             max_new_tokens or (128 if device.startswith("cuda") else 32))


COMMANDS = [serve, up, down, demo]
