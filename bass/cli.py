"""The `bass` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import click

from dataclasses import asdict, replace
from pathlib import Path

from bass.config import (ATTENTION_BACKENDS, DTYPES, CoordinatorConfig, DraftLengthConfig, RunnerConfig,
                         SamplingParams, SchedulerConfig, ServeConfig, WorkerServiceConfig, load_config_file,
                         resolve_device, resolve_dtype)
from bass.errors import BassError


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """BASS: batched speculative decoding as a service."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _parse_ids(_ctx, _param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(t) for t in value.replace(" ", "").split(",") if t)
    except ValueError:
        raise click.BadParameter("expected comma-separated integers, e.g. 1,2,3") from None


def _parse_draft_length(_ctx, _param, value: str) -> DraftLengthConfig:
    try:
        return DraftLengthConfig.parse(value)
    except BassError as e:
        raise click.BadParameter(str(e)) from None


@main.command()
@click.option("--target", "target_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="Target model directory (config.json + *.safetensors).")
@click.option("--draft", "draft_dir", type=click.Path(exists=True, file_okay=False),
              help="Draft model directory; without it, regular decoding.")
@click.option("--prompt", help="Prompt text (tokenized with the target's tokenizer).")
@click.option("--prompt-ids", callback=_parse_ids, help="Prompt as comma-separated token ids.")
@click.option("-n", "n", default=1, show_default=True, help="Sequences to sample for the prompt.")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--top-k", default=0, show_default=True, help="0 = off.")
@click.option("--seed", type=int, help="Makes sampled output reproducible.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--draft-length", default="auto", show_default=True, callback=_parse_draft_length,
              help="auto | bass | adaptive | fixed | an integer k (0 = regular decoding).")
@click.option("--draft-top-n", default=64, show_default=True,
              help="The draft finds its top-k / top-p cut among its N most likely tokens.")
@click.option("--device", default="auto", show_default=True,
              help="auto | cpu | cuda | cuda:N (auto: the GPU where there is one, as `bass serve`).")
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True,
              help="auto: bfloat16 on a GPU, float32 on the CPU.")
@click.option("--attention", type=click.Choice(ATTENTION_BACKENDS), default="auto", show_default=True,
              help="auto: triton on CUDA, pad on the CPU.")
@click.option("--max-seq-len", default=2048, show_default=True, help="KV cache length per sequence.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def generate(target_dir, draft_dir, prompt, prompt_ids, n, max_new_tokens, temperature, top_p, top_k, seed, stop,
             draft_length, draft_top_n, device, dtype, attention, max_seq_len, as_json) -> None:
    """Generate in-process (no services) with speculative or regular decoding."""
    from bass.coordinator.requests import GenerationRequest
    from bass.local import build_local_scheduler

    try:
        request = GenerationRequest(prompt=prompt, prompt_ids=prompt_ids, n=n, max_new_tokens=max_new_tokens,
                                    sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p),
                                    seed=seed, stop=stop)
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        runner = dict(device=device, dtype=dtype, num_slots=max(n, 1), max_seq_len=max_seq_len, attention=attention)
        speculate = draft_dir is not None and draft_length.speculates
        t0 = time.perf_counter()
        scheduler = build_local_scheduler(
            RunnerConfig(model_dir=target_dir, **runner),
            RunnerConfig(model_dir=draft_dir, **runner) if speculate else None,
            scheduler=SchedulerConfig(max_batch_size=max(n, 1), max_n=max(n, 1), max_new_tokens=max_new_tokens,
                                      draft_length=draft_length),
            draft_top_n=draft_top_n)
        load_s = time.perf_counter() - t0
        (result,) = scheduler.generate([request])
    except BassError as e:
        raise click.UsageError(str(e)) from None
    out = result.to_dict()
    out["stats"]["mode"] = "speculative" if speculate else "regular"
    out["stats"]["device"], out["stats"]["dtype"] = device, dtype
    out["stats"]["load_time_s"] = round(load_s, 3)
    if as_json:
        click.echo(json.dumps(out))
        return
    for s in out["sequences"]:
        click.echo(f"--- sequence {s['index']} ({s['finish_reason']}, {len(s['token_ids'])} tokens)")
        click.echo(s["text"])
    click.echo(f"--- stats: {json.dumps(out['stats'])}")




def _emit_result(result: dict, out: str | None) -> None:
    """A benchmark's JSON: printed, and written to `out` too when given (for bench/results)."""
    text = json.dumps(result, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    click.echo(text)


@main.group()
def bench() -> None:
    """Measurements; results are JSON (with device, model and commit) for bench/results/."""


def _sampling_modes(modes: str) -> dict:
    """--modes 'greedy,t0.8-p0.95' -> {name: SamplingParams}, or a usage error naming the unknown ones."""
    from bass.bench.acceptance import MODES

    names = [m for m in modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown modes {unknown}; known: {sorted(MODES)}", param_hint="--modes")
    return {m: MODES[m] for m in names}


@bench.command("acceptance")
@click.option("--target", "target_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--draft", "draft_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--problems", default="0:8", show_default=True, help="HumanEval problems: '0:16', '1,5,9' or 'all'.")
@click.option("-n", "n", default=1, show_default=True, help="Sequences per prompt.")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--draft-lengths", default="2,4,8", show_default=True, help="Comma-separated policies or k values.")
@click.option("--modes", default="greedy,t0.8-p0.95", show_default=True)
@click.option("--batch-prompts", default=8, show_default=True, help="Prompts run together in one batch.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--max-seq-len", default=1024, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON here too.")
def bench_acceptance(target_dir, draft_dir, problems, n, max_new_tokens, draft_lengths, modes, batch_prompts, device,
                     dtype, max_seq_len, out) -> None:
    """Draft acceptance on HumanEval prompts for several draft lengths and sampling modes."""
    from bass.bench.acceptance import measure
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select

    chosen = select(load_problems(), None if problems == "all" else problems)
    mode_list = list(_sampling_modes(modes))
    runner = dict(device=device, dtype=dtype, num_slots=batch_prompts * n, max_seq_len=max_seq_len)
    rows = measure(RunnerConfig(model_dir=target_dir, **runner), RunnerConfig(model_dir=draft_dir, **runner),
                   [p["prompt"] for p in chosen], n=n, max_new_tokens=max_new_tokens,
                   draft_lengths=[d for d in draft_lengths.split(",") if d], modes=mode_list,
                   batch_prompts=batch_prompts, progress=lambda msg: click.echo(msg, err=True))
    result = {"benchmark": "acceptance", "environment": describe(device),
              "target": str(target_dir), "draft": str(draft_dir), "dtype": dtype,
              "problems": f"HumanEval {problems} ({len(chosen)})", "results": rows}
    _emit_result(result, out)


@bench.command("acceptance-rules")
@click.option("--target", "target_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--draft", "draft_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--problems", default="0:8", show_default=True, help="HumanEval problems: '0:16', '1,5,9' or 'all'.")
@click.option("-n", "n", default=1, show_default=True, help="Sequences per prompt.")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--modes", default="t0.8-p0.95,t0.2-p0.95", show_default=True)
@click.option("--draft-top-n", default=64, show_default=True,
              help="The draft's q for scoring: its N most likely tokens, top-k / top-p cut among them.")
@click.option("--draft-vocabs", default="0", show_default=True,
              help="Draft LM heads to score, by how many of the first token ids they cover (0 = all).")
@click.option("--batch-prompts", default=8, show_default=True, help="Prompts sampled together in one batch.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--max-seq-len", default=1024, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON here too.")
def bench_acceptance_rules(target_dir, draft_dir, problems, n, max_new_tokens, modes, draft_top_n, draft_vocabs,
                           batch_prompts, device, dtype, max_seq_len, out) -> None:
    """Exact acceptance odds of the standard rule and of the Gumbel coupling on the same target
    trajectories (HumanEval prompts)."""
    from bass.bench.acceptance_rules import measure
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select

    chosen = select(load_problems(), None if problems == "all" else problems)
    sampling_modes = _sampling_modes(modes)
    runner = dict(device=device, dtype=dtype, num_slots=batch_prompts * n, max_seq_len=max_seq_len)
    rows = measure(RunnerConfig(model_dir=target_dir, **runner), RunnerConfig(model_dir=draft_dir, **runner),
                   [p["prompt"] for p in chosen], n=n, max_new_tokens=max_new_tokens,
                   modes=sampling_modes, draft_top_n=draft_top_n,
                   draft_vocabs=tuple(int(v) for v in draft_vocabs.split(",")), batch_prompts=batch_prompts,
                   progress=lambda msg: click.echo(msg, err=True))
    result = {"benchmark": "acceptance-rules", "environment": describe(device), "target": str(target_dir),
              "draft": str(draft_dir), "dtype": dtype, "problems": f"HumanEval {problems} ({len(chosen)})",
              "results": rows}
    _emit_result(result, out)


@bench.command("invariance")
@click.option("--target", "target_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--draft", "draft_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--problems", default="0:16", show_default=True, help="HumanEval problems, one request each.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--modes", default="greedy,t0.8-p0.95", show_default=True)
@click.option("--policies", default="0,4,auto", show_default=True, help="Draft-length policies compared.")
@click.option("--batch-invariant", is_flag=True, help="Run the target in its batch-invariant mode.")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True)
@click.option("--max-seq-len", default=1024, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False))
def bench_invariance(target_dir, draft_dir, problems, max_new_tokens, modes, policies, batch_invariant, device,
                     dtype, max_seq_len, out) -> None:
    """Seeded requests alone vs in one batch, regular vs speculative: which sequences' tokens
    differ, and where they first do (numerics of batch-dependent kernels)."""
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select
    from bass.bench.invariance import measure

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    chosen = select(load_problems(), problems)
    sampling_modes = _sampling_modes(modes)
    runner = dict(device=device, dtype=dtype, num_slots=len(chosen), max_seq_len=max_seq_len)
    rows = measure(RunnerConfig(model_dir=target_dir, batch_invariant=batch_invariant, **runner),
                   RunnerConfig(model_dir=draft_dir, **runner) if draft_dir else None,
                   [p["prompt"] for p in chosen], modes=sampling_modes,
                   policies=[p for p in policies.split(",") if p], max_new_tokens=max_new_tokens,
                   progress=lambda msg: click.echo(msg, err=True))
    result = {"benchmark": "invariance", "environment": describe(device), "target": str(target_dir),
              "draft": str(draft_dir), "dtype": dtype, "batch_invariant": batch_invariant, "problems": f"HumanEval {problems} ({len(chosen)})",
              "results": rows}
    _emit_result(result, out)


def _register_model_commands() -> None:
    from bass.models.commands import convert_gguf_command, fetch_models_command

    main.add_command(convert_gguf_command)
    main.add_command(fetch_models_command)


_register_model_commands()


@bench.command("speed")
@click.option("--target", "target_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--draft", "draft_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--problems", default="0:16", show_default=True, help="HumanEval problems used as prompts.")
@click.option("--batches", default="1,8", show_default=True, help="Sequences per batch (one per prompt).")
@click.option("--policies", default="0,auto,bass,4", show_default=True, help="Draft-length policies; 0 = regular.")
@click.option("--mode", type=click.Choice(["greedy", "t0.8-p0.95"]), default="greedy", show_default=True)
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--services", is_flag=True, help="Through the real draft/target gRPC services (RPC cost included).")
@click.option("--separate-draft", is_flag=True,
              help="With --services: the draft in a process of its own [in the target's, as `bass serve`].")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True)
@click.option("--attention", type=click.Choice(ATTENTION_BACKENDS), default=None,
              help="[triton on CUDA, pad on CPU]")
@click.option("--max-seq-len", default=1024, show_default=True)
@click.option("--peak-tflops", type=float, help="Peak dense bf16 TFLOP/s for GPU utilization (H100 SXM: 989).")
@click.option("--repeats", default=3, show_default=True, help="Measured runs per configuration; the median is reported.")
@click.option("--batch-invariant", is_flag=True, help="Run the target in its batch-invariant mode (what it costs).")
@click.option("--draft-int8/--no-draft-int8", default=None,
              help="The draft's projections and LM head in weight-only int8 for few-row steps [on with the "
                   "Triton kernels].")
@click.option("--trace", is_flag=True, help="Keep the reported round's per-step trace (draft length, sequences, "
                                             "tokens, times) and the coordinator's garbage collections "
                                             "in each row.")
@click.option("--out", type=click.Path(dir_okay=False))
def bench_speed(target_dir, draft_dir, problems, batches, policies, mode, max_new_tokens, services, separate_draft,
                device, dtype, attention, max_seq_len, peak_tflops, repeats, batch_invariant, draft_int8, trace,
                out) -> None:
    """End-to-end decoding speed: regular vs speculative, in-process or through the services."""
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select
    from bass.bench.speed import measure

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    attention = attention or ("triton" if device.startswith("cuda") else "pad")
    batch_list = [int(b) for b in batches.split(",")]
    runner = dict(device=device, dtype=dtype, num_slots=max(batch_list), max_seq_len=max_seq_len, attention=attention)
    prompts = [p["prompt"] for p in select(load_problems(), problems)]
    rows = measure(RunnerConfig(model_dir=target_dir, batch_invariant=batch_invariant, **runner),
                   RunnerConfig(model_dir=draft_dir, int8_weights=draft_int8, **runner), prompts, batches=batch_list, policies=[p for p in policies.split(",") if p], mode=mode,
                   max_new_tokens=max_new_tokens, services=services, peak_tflops=peak_tflops, repeats=repeats,
                   progress=lambda m: click.echo(m, err=True), colocate=not separate_draft, trace=trace)
    result = {"benchmark": "speed", "environment": describe(device), "target": str(target_dir), "draft": str(draft_dir),
              "dtype": dtype, "attention": attention, "batch_invariant": batch_invariant, "draft_int8": draft_int8,
              "problems": problems, "results": rows}
    _emit_result(result, out)


@bench.command("hf")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--problems", default="0:16", show_default=True)
@click.option("--batches", default="1,8", show_default=True)
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--static-compile", is_flag=True, help="Static cache + torch.compile (transformers' fast path).")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False))
def bench_hf(model_dir, problems, batches, max_new_tokens, static_compile, device, dtype, out) -> None:
    """Baseline: transformers' greedy generate on the same prompts (ms per token per sequence)."""
    from bass.bench.environment import describe
    from bass.bench.hf_baseline import measure
    from bass.bench.humaneval import load_problems, select

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    prompts = [p["prompt"] for p in select(load_problems(), problems)]
    rows = [measure(Path(model_dir), prompts, batch=int(b), max_new_tokens=max_new_tokens, device=device, dtype=dtype,
                    static_compile=static_compile) for b in batches.split(",")]
    result = {"benchmark": "hf", "environment": describe(device), "model": str(model_dir), "dtype": dtype,
              "problems": problems, "results": rows}
    _emit_result(result, out)


@bench.command("steps")
@click.option("--target", default="qwen2.5-coder-1.5b", show_default=True, help="Shape preset of the target.")
@click.option("--draft", default="qwen2.5-coder-0.5b", show_default=True, help="Shape preset of the draft.")
@click.option("--batches", default="1,8,32,64", show_default=True)
@click.option("--draft-lengths", default="1,2,3,4,6,8", show_default=True)
@click.option("--context", default=512, show_default=True, help="Tokens already cached per sequence.")
@click.option("--alpha", default=0.94, show_default=True,
              help="Per-token acceptance for the derived speculative figures (0.94: measured on the real pair).")
@click.option("--configs", default="pad:eager,triton:eager,triton:graphs", show_default=True,
              help="attention:eager|graphs pairs.")
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option("--repeats", default=30, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False))
def bench_steps(target, draft, batches, draft_lengths, context, alpha, configs, dtype, repeats, out) -> None:
    """Measured step costs (random weights, real shapes) and derived speculative latency (GPU)."""
    import torch

    from bass.bench.environment import describe
    from bass.bench.steps import SHAPES, measure, shape_config, weight_bytes

    if not torch.cuda.is_available():
        raise click.UsageError("bench steps needs a CUDA device")
    for name in (target, draft):
        if name not in SHAPES:
            raise click.BadParameter(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    pairs = [(c.split(":")[0], c.split(":")[1] == "graphs") for c in configs.split(",")]
    rows = measure(target, draft, batches=[int(b) for b in batches.split(",")],
                   draft_lengths=[int(k) for k in draft_lengths.split(",")], context=context, alpha=alpha,
                   configs=pairs, dtype=dtype, repeats=repeats, progress=lambda m: click.echo(m, err=True))
    props = torch.cuda.get_device_properties(0)
    floor_ms = {name: weight_bytes(shape_config(name), dtype) / 4.28e12 * 1e3 for name in (target, draft)}
    result = {"benchmark": "steps", "environment": describe("cuda"), "target": target, "draft": draft, "dtype": dtype,
              "weights_floor_ms_at_4.28TBps": {k: round(v, 4) for k, v in floor_ms.items()},
              "gpu_memory_gb": round(props.total_memory / 2**30, 1), "alpha_for_derived": alpha,
              "note": "random weights at real shapes; speculative figures are derived from measured step costs "
                      "and alpha", "results": rows}
    _emit_result(result, out)


# -- services ------------------------------------------------------------------------------------------
def _explicit(ctx: click.Context, names: list[str]) -> dict:
    """The options the user actually gave (so they override a config file, defaults do not)."""
    from click.core import ParameterSource

    return {n: ctx.params[n] for n in names
            if ctx.params.get(n) is not None and ctx.get_parameter_source(n) != ParameterSource.DEFAULT}


def _load(config_file: str | None, config_json: str | None, cls, section: str | None):
    """A config from --config-json (used by `bass serve` for its children) or a [section] of a
    --config TOML file, else defaults."""
    from pydantic import TypeAdapter

    if config_json:
        return TypeAdapter(cls).validate_json(config_json)
    if config_file:
        serve = load_config_file(Path(config_file))
        value = getattr(serve, section)
        return value if value is not None else cls()
    return cls()


def _fail(e: Exception):
    raise click.UsageError(str(e)) from None


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
        cfg = _load(p["config_file"], p["config_json"], WorkerServiceConfig, section)
        cfg = replace(cfg, **_explicit(ctx, WORKER_OPTIONS + list(extra)))
        device = resolve_device(cfg.device)
        return replace(cfg, device=device, dtype=resolve_dtype(cfg.dtype, device))
    except BassError as e:
        _fail(e)


def _freeze_startup_heap() -> None:
    from bass.grpc_server import freeze_startup_heap

    freeze_startup_heap()


def _serve_worker(kind: str, cfg: WorkerServiceConfig) -> None:
    from bass.launcher import ready_line

    if kind == "target":
        from bass.target_service.server import serve
    else:
        from bass.draft_service.server import serve
    try:
        server = serve(cfg)
    except (BassError, FileNotFoundError, ValueError) as e:
        _fail(e)
    _freeze_startup_heap()
    click.echo(ready_line(kind, f"{cfg.host}:{server.port}"))
    server.wait_for_signal()


@main.command("target-service")
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
    from bass.launcher import ready_line
    from bass.target_service.colocated import serve

    try:
        server = serve(target, _colocated_draft_config(ctx, target, draft_dir, draft_top_n, draft_config_json))
    except (BassError, FileNotFoundError, ValueError) as e:
        _fail(e)
    _freeze_startup_heap()
    click.echo(ready_line("target", f"{target.host}:{server.port}"))
    server.wait_for_signal()


def _colocated_draft_config(ctx, target: WorkerServiceConfig, draft_dir: str | None, draft_top_n: int | None,
                            draft_config_json: str | None) -> WorkerServiceConfig:
    """The draft's config for `target-service --draft`: its [draft] section (or what `bass serve`
    passed), else the target's cache sizes; always the target's device and dtype."""
    try:
        if draft_config_json or ctx.params["config_file"]:
            base = _load(ctx.params["config_file"], draft_config_json, WorkerServiceConfig, "draft")
        else:
            base = WorkerServiceConfig(num_slots=target.num_slots, max_seq_len=target.max_seq_len,
                                       attention=target.attention)
        return replace(base, model_dir=draft_dir or base.model_dir, device=target.device, dtype=target.dtype,
                       draft_top_n=draft_top_n or base.draft_top_n)
    except BassError as e:
        _fail(e)


@main.command("draft-service")
@worker_options
@click.option("--draft-top-n", type=int, help="The draft finds its top-k / top-p cut among its N most likely tokens [64].")
@click.pass_context
def draft_service(ctx, **_) -> None:
    """Serve the draft model (bass.v1.DraftWorker)."""
    _serve_worker("draft", _worker_config(ctx, "draft", ["draft_top_n"]))


def scheduler_options(f):
    for opt in reversed([
        click.option("--draft-length", callback=lambda c, p, v: None if v is None else _parse_draft_length(c, p, v),
                     help="auto | bass | adaptive | fixed | K (0 = regular decoding) [auto]."),
        click.option("--max-batch-size", type=int, help="Sequences per step [64]."),
        click.option("--max-n", type=int, help="Largest n a request may ask for [16]."),
        click.option("--max-new-tokens-limit", "max_new_tokens", type=int, help="Largest max_new_tokens [2048]."),
        click.option("--max-waiting", type=int, help="Queued requests before RESOURCE_EXHAUSTED [256]."),
        click.option("--max-prefill-tokens-per-step", type=int,
                     help="Prompt tokens prefilled per step, target and draft together; a longer prompt goes "
                          "alone [512]."),
    ]):
        f = opt(f)
    return f


def _with_scheduler_options(ctx, cfg: CoordinatorConfig) -> CoordinatorConfig:
    sched = _explicit(ctx, ["max_batch_size", "max_n", "max_new_tokens", "max_prefill_tokens_per_step"])
    if ctx.params.get("draft_length") is not None:
        sched["draft_length"] = ctx.params["draft_length"]
    return replace(cfg, scheduler=replace(cfg.scheduler, **sched), **_explicit(ctx, ["max_waiting"]))


@main.command("coordinator")
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
    from bass.coordinator.server import serve
    from bass.launcher import ready_line

    p = ctx.params
    try:
        cfg = _load(p["config_file"], p["config_json"], CoordinatorConfig, "coordinator")
        cfg = _with_scheduler_options(ctx, replace(cfg, **_explicit(
            ctx, ["target_address", "draft_address", "tokenizer_dir", "host", "port", "metrics_port"])))
        running = serve(cfg)
    except BassError as e:
        _fail(e)
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


def default_model_pair() -> tuple[Path, Path]:
    """(draft, target) directories made by `make models`."""
    from bass.models.fetch import default_model_dirs

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
        click.option("--device", help="cpu | cuda | auto [auto]."),
        click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), help="[auto: bfloat16 on GPU, float32 on CPU]"),
        click.option("--num-slots", type=int, help="KV cache slots per model [64]."),
        click.option("--max-seq-len", type=int, help="KV cache positions per sequence [2048]."),
        click.option("--batch-invariant", is_flag=True, default=None,
                     help="Target computes each row the same way whatever the batch: seeded and greedy "
                          "tokens do not move with load (slower)."),
        click.option("--separate-draft", is_flag=True, default=None,
                     help="Run the draft in a process of its own (it can fail or restart alone; a "
                          "speculative step then makes two calls instead of one) [off: in the target's]."),
        scheduler_options,
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
                     help="TOML with [target], [draft], [coordinator] sections (see README)."),
    ]):
        f = opt(f)
    return f


def _serve_config(ctx: click.Context, default_port: int | None = None) -> ServeConfig:
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
    draft = None
    if p["draft_dir"] != "none":
        base = cfg.draft or WorkerServiceConfig()
        draft = replace(base, device=dev, dtype=dt, **workers,
                        model_dir=_require_model(p["draft_dir"] or base.model_dir or default_model_pair()[0], "draft"))
    coord = _with_scheduler_options(ctx, cfg.coordinator)
    port = p["port"] if p["port"] is not None else default_port
    coord = replace(coord, **{k: v for k, v in dict(port=port, metrics_port=p["metrics_port"]).items()
                              if v is not None})
    return ServeConfig(target=target, draft=draft, coordinator=coord,
                       colocate=cfg.colocate and not p["separate_draft"])


@main.command("serve")
@serve_options
@click.pass_context
def serve(ctx, **_) -> None:
    """Start target, draft and coordinator locally and stop them together (the draft in the
    target's process unless --separate-draft)."""
    from bass.launcher import launch, run_until_stopped

    try:
        processes = launch(_serve_config(ctx), echo=click.echo)
    except BassError as e:
        _fail(e)
    click.echo(f"BASS is serving on {processes[-1].address} (Ctrl-C stops all services)", err=True)
    raise SystemExit(run_until_stopped(processes))


def _parse_loads(value: str | None, kind: str):
    from bass.bench.serve import Load

    if value is None:
        return ()
    try:
        return tuple(Load(kind, float(v)) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, e.g. 1,2,4{',inf' if kind == 'rate' else ''}")


@bench.command("serve")
@click.option("--address", help="host:port of a running coordinator (or --serve).")
@click.option("--serve", "start_server", is_flag=True,
              help="Start `bass serve` with the model flags below (port: any free one) and stop it at the end.")
@click.option("--rates", help="Open loop: Poisson arrivals at these requests/s, e.g. 1,2,4,8,16,inf (inf: all at once).")
@click.option("--concurrency", help="Closed loop: this many clients, each sending its next request when one ends (e.g. 1,8,64).")
@click.option("--num-requests", type=int, help="Requests per run [100 unless --duration].")
@click.option("--duration", type=float, help="Seconds of arrivals per run (with --num-requests: whichever ends first).")
@click.option("--prompts-file", type=click.Path(exists=True, dir_okay=False),
              help="JSONL, one {\"prompt\": ...} per line [HumanEval's prompts].")
@click.option("--problems", help="HumanEval problems to use, e.g. 0:32 [all 164].")
@click.option("-n", "n", default=1, show_default=True, help="Sequences per request.")
# dest new_tokens: `max_new_tokens` is the server's limit (--max-new-tokens-limit) among serve_options
@click.option("--max-new-tokens", "new_tokens", default=128, show_default=True, help="Per request.")
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seeds arrivals, prompt order and sampled requests.")
@click.option("--unseeded", is_flag=True, help="Sampled requests carry no seed (their answers cannot be checked).")
@click.option("--slo-ttft-ms", type=float, help="Goodput: time to first token at most this.")
@click.option("--slo-tpot-ms", type=float, help="Goodput: time per output token at most this.")
@click.option("--compare-regular", is_flag=True, help="Run the same arrivals again with disable_speculation.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Send each distinct request alone first and compare every answer under load with it.")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, help="Deadline per request (s).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write serve.json, serve.md and serve.png here.")
@serve_options
@click.pass_context
def bench_serve(ctx, address, start_server, rates, concurrency, num_requests, duration, prompts_file, problems, n,
                new_tokens, temperature, top_p, seed, unseeded, slo_ttft_ms, slo_tpot_ms, compare_regular, check,
                timeout_s, progress, out_dir, **_) -> None:
    """Load benchmark through the public API: TTFT, TPOT, ITL, throughput, goodput, errors, correctness."""
    from click.core import ParameterSource

    from bass.bench.environment import describe
    from bass.bench.serve import ServeBenchConfig, run
    from bass.bench.serve_report import markdown_table, plot
    from bass.bench.serve_stats import Slo
    from bass.bench.serve_workload import load_prompts
    from bass.launcher import launch, stop_all

    if bool(address) == bool(start_server):
        raise click.UsageError("give exactly one of --address or --serve")
    model_flags = [o.name for o in serve.params if ctx.get_parameter_source(o.name) == ParameterSource.COMMANDLINE]
    if address and model_flags:
        raise click.UsageError(f"{', '.join('--' + f.replace('_', '-') for f in model_flags)} need --serve")
    loads = _parse_loads(rates, "rate") + _parse_loads(concurrency, "concurrency")
    try:
        config = ServeBenchConfig(
            loads=loads, num_requests=num_requests if num_requests or duration else 100, duration_s=duration, n=n,
            max_new_tokens=new_tokens, temperature=temperature, top_p=top_p, seed=seed, seeded=not unseeded,
            compare_regular=compare_regular, check=check, slo=Slo(slo_ttft_ms, slo_tpot_ms), timeout_s=timeout_s)
        prompts = load_prompts(prompts_file and Path(prompts_file), problems)
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from None
    processes, server, device = [], None, "client"
    try:
        if start_server:
            try:
                server = _serve_config(ctx, default_port=0)
                processes = launch(server, echo=lambda m: click.echo(m, err=True))
            except BassError as e:
                _fail(e)
            address, device = processes[-1].address, server.target.device
        result = run(address, config, prompts, show_progress=progress, log=lambda m: click.echo(m, err=True))
    except ConnectionError as e:
        raise click.ClickException(str(e)) from None
    finally:
        stop_all(processes)
    environment = describe(device)
    if not start_server:  # the service may run beside this client: name the GPU it would share
        import torch

        if torch.cuda.is_available():
            environment["gpu_on_client_machine"] = torch.cuda.get_device_name(0)
    result = {"benchmark": "serve", "environment": environment, "address": address,
              "server": json.loads(json.dumps({k: asdict(server)[k] for k in ("target", "draft", "coordinator")},
                                              default=str)) if server else None,
              "prompts": {"source": prompts_file or f"HumanEval {problems or 'all'}", "count": len(prompts)},
              **result}
    table = markdown_table(result)
    click.echo(table)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "serve.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "serve.md").write_text(table)
        try:
            plot(result, out / "serve.png")
        except ImportError:
            click.echo("matplotlib is missing: no serve.png (python -m bass.bench.serve_report serve.json draws it)",
                       err=True)


@main.group("eval")
def eval_group() -> None:
    """Quality evaluations through a running service."""


@eval_group.command("humaneval")
@click.option("--address", default="127.0.0.1:50051", show_default=True)
@click.option("--n", "n", default=8, show_default=True, help="Sequences per problem.")
@click.option("--time-budget-ms", "budgets", default="2000", show_default=True, help="Comma-separated budgets.")
@click.option("--problems", default="all", show_default=True, help="'all', '0:16' or '1,5,9'.")
@click.option("--modes", default="speculative,regular", show_default=True)
@click.option("--temperature", default=0.8, show_default=True, help="0 with --n 1 for greedy.")
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--max-new-tokens", default=384, show_default=True)
@click.option("--timeout-s", default=10.0, show_default=True, help="Sandbox wall-clock limit per completion.")
@click.option("--sandbox-workers", default=2, show_default=True,
              help="Completions run at once (keep it below the free cores, so that scoring does not slow the service).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write results.json, results.md, pass_rates.png.")
def eval_humaneval(address, n, budgets, problems, modes, temperature, top_p, max_new_tokens, timeout_s, sandbox_workers,
                   out_dir) -> None:
    """HumanEval Pass@First / Pass@All within time budgets, speculative vs regular, run in a sandbox."""
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select
    from bass.evaluation.humaneval import evaluate, markdown_table, plot
    from bass.evaluation.sandbox import SandboxLimits

    chosen = select(load_problems(), None if problems == "all" else problems)
    rows = evaluate(address, chosen, n=n, budgets_ms=[int(b) for b in budgets.split(",")],
                    modes=[m for m in modes.split(",") if m], temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, limits=SandboxLimits(timeout_s=timeout_s),
                    sandbox_workers=sandbox_workers, progress=lambda m: click.echo(m, err=True))
    table = markdown_table(rows)
    click.echo(table)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"benchmark": "humaneval-time-budget",
                                                      "environment": describe("client"), "address": address,
                                                      "problems": problems, "temperature": temperature,
                                                      "top_p": top_p, "results": rows}, indent=2) + "\n")
        (out / "results.md").write_text(table)
        plot(rows, out / "pass_rates.png")


@main.command("up")
@click.option("--ray-address", help="Ray cluster to join (ray://host:10001 or host:6379); none: start a local one.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML with [target], [draft], [coordinator] and [ray] sections (see README).")
@click.option("--target", "target_dir", type=click.Path(file_okay=False), help="[the bundled 1.5B]")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False), help="[the bundled 0.5B]; 'none' to skip")
@click.option("--num-gpus", type=int, help="GPUs of the local Ray started when no --ray-address is given.")
def up(ray_address, config_file, target_dir, draft_dir, num_gpus) -> None:
    """Start target, draft and coordinator as Ray actors, placed as [ray] says; print the public address."""
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
        cfg = replace(cfg, target=target, draft=draft)
        if not ray_address:
            launcher.start_local_ray(num_gpus)
        launcher.connect(ray_address, cfg.ray.namespace)
        addresses = launcher.up(cfg, echo=lambda m: click.echo(m, err=True))
    except BassError as e:
        _fail(e)
    for kind, address in addresses.items():
        click.echo(json.dumps({"service": kind, "address": address}))
    click.echo(f"BASS is serving on {addresses['coordinator']} (stop it with `bass down`)", err=True)


@main.command("down")
@click.option("--ray-address", help="Ray cluster the services run on [the local one].")
@click.option("--namespace", default="bass", show_default=True)
@click.option("--stop-ray", is_flag=True, help="Also stop the local Ray that `bass up` started.")
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


@main.command("demo")
@click.option("--target", "target_dir", type=click.Path(file_okay=False), help="[the bundled 1.5B]")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False), help="[the bundled 0.5B]")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + ("auto",)), default="auto", show_default=True)
@click.option("-n", "n", default=8, show_default=True)
@click.option("--max-new-tokens", type=int, help="[32 on CPU, 128 on GPU]")
def demo(target_dir, draft_dir, device, dtype, n, max_new_tokens) -> None:
    """Serve the bundled pair and run one real multi-sequence request (what `make demo` runs)."""
    from bass.demo import run_demo

    device = resolve_device(device)
    target = _require_model(target_dir or default_model_pair()[1], "target")
    draft = _require_model(draft_dir or default_model_pair()[0], "draft")
    run_demo(target, draft, device, resolve_dtype(dtype, device), n,
             max_new_tokens or (128 if device.startswith("cuda") else 32))


@main.command("client")
@click.option("--address", default="127.0.0.1:50051", show_default=True)
@click.option("--prompt", help="Prompt text.")
@click.option("--prompt-ids", callback=_parse_ids, help="Prompt as comma-separated token ids.")
@click.option("-n", "n", default=1, show_default=True)
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--top-k", default=0, show_default=True)
@click.option("--seed", type=int)
@click.option("--stop", multiple=True)
@click.option("--time-budget-ms", default=0, show_default=True)
@click.option("--no-speculation", is_flag=True, help="Regular decoding for this request.")
@click.option("--stream", is_flag=True, help="Print tokens as they commit.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--timeout", default=600.0, show_default=True, help="Deadline in seconds.")
def client(address, prompt, prompt_ids, n, max_new_tokens, temperature, top_p, top_k, seed, stop, time_budget_ms,
           no_speculation, stream, as_json, timeout) -> None:
    """Send one request to a running coordinator."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from bass.client import BassClient

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-ids")
    options = dict(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                   stop=stop, time_budget_ms=time_budget_ms, speculate=not no_speculation)
    with BassClient(address, timeout_s=timeout) as c:
        try:
            if stream:
                for message in c.stream_raw(prompt if prompt is not None else list(prompt_ids), **options):
                    if as_json:
                        click.echo(json.dumps(MessageToDict(message)))
                    else:
                        for d in message.deltas:
                            click.echo(f"[{d.index}] {d.text}", nl=False) if n > 1 else click.echo(d.text, nl=False)
                if not as_json:
                    click.echo()
                return
            response = c.generate(prompt if prompt is not None else list(prompt_ids), **options)
        except grpc.RpcError as e:
            raise click.ClickException(f"{e.code().name}: {e.details()}") from None
    if as_json:
        click.echo(json.dumps(MessageToDict(response, always_print_fields_with_no_presence=True)))
        return
    for s in response.sequences:
        click.echo(f"--- sequence {s.index} ({len(s.token_ids)} tokens)")
        click.echo(s.text)
    click.echo(f"--- stats: {json.dumps(MessageToDict(response.stats))}")


if __name__ == "__main__":
    main()
