"""`bass bench ...`: measurements. Each prints JSON (with device, models and commit) for
bench/results/; the code that measures lives in bass/app/bench/."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from bass.app.cli.options import fail
from bass.app.cli.serve import serve, serve_config, serve_options
from bass.core.config import (ATTENTION_BACKENDS, DEFAULT_LOOKUP_TAIL, DTYPES, RunnerConfig, resolve_device, resolve_dtype,
                              same_device)
from bass.core.errors import BassError


def bench_options(*, models: str | None = None, problems: str | None = None, n: bool = False,
                  max_new_tokens: int | None = None, device: str | None = None, dtype: str | None = None,
                  max_seq_len: int | None = None, out: str | None = "Write the JSON here too."):
    """The options the bench commands share, always in this order, each with the command's default
    (None leaves an option out): the models (models="pair": --target and --draft model
    directories; "target": the draft optional; "model": one --model), the workload (--problems,
    -n, --max-new-tokens), where it runs (--device, --dtype: "auto" offers auto, --max-seq-len)
    and --out (its help)."""
    model_dir = click.Path(exists=True, file_okay=False)
    options = []
    if models in ("pair", "target"):
        options += [click.option("--target", "target_dir", required=True, type=model_dir),
                    click.option("--draft", "draft_dir", required=models == "pair", type=model_dir)]
    elif models == "model":
        options.append(click.option("--model", "model_dir", required=True, type=model_dir))
    if problems is not None:
        options.append(click.option("--problems", default=problems, show_default=True,
                                    help="HumanEval problems: '0:16', '1,5,9' or 'all'."))
    if n:
        options.append(click.option("-n", "n", default=1, show_default=True, help="Sequences per prompt."))
    if max_new_tokens is not None:
        options.append(click.option("--max-new-tokens", default=max_new_tokens, show_default=True))
    if device is not None:
        options.append(click.option("--device", default=device, show_default=True))
    if dtype is not None:
        choices = DTYPES + ("auto",) if dtype == "auto" else DTYPES
        options.append(click.option("--dtype", type=click.Choice(choices), default=dtype, show_default=True))
    if max_seq_len is not None:
        options.append(click.option("--max-seq-len", default=max_seq_len, show_default=True))
    if out is not None:
        options.append(click.option("--out", type=click.Path(dir_okay=False), help=out))

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


def _emit_result(result: dict, out: str | None) -> None:
    """A benchmark's JSON: printed, and written to `out` too when given (for bench/results)."""
    text = json.dumps(result, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    click.echo(text)


@click.group("bench")
def bench() -> None:
    """Measurements; results are JSON (with device, model and commit) for bench/results/."""


def _sampling_modes(modes: str) -> dict:
    """--modes 'greedy,t0.8-p0.95' -> {name: SamplingParams}, or a usage error naming the unknown ones."""
    from bass.app.bench.acceptance import MODES

    names = [m for m in modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown modes {unknown}; known: {sorted(MODES)}", param_hint="--modes")
    return {m: MODES[m] for m in names}


@bench.command("acceptance")
@bench_options(models="pair", problems="0:8", n=True, max_new_tokens=64, device="cpu", dtype="float32",
               max_seq_len=1024)
@click.option("--draft-lengths", default="2,4,8", show_default=True, help="Comma-separated policies or k values.")
@click.option("--modes", default="greedy,t0.8-p0.95", show_default=True)
@click.option("--batch-prompts", default=8, show_default=True, help="Prompts run together in one batch.")
def bench_acceptance(target_dir, draft_dir, problems, n, max_new_tokens, draft_lengths, modes, batch_prompts, device,
                     dtype, max_seq_len, out) -> None:
    """Draft acceptance on HumanEval prompts for several draft lengths and sampling modes."""
    from bass.app.bench.acceptance import measure
    from bass.app.bench.environment import describe
    from bass.app.humaneval_problems import load_problems, select

    chosen = select(load_problems(), problems)
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
@bench_options(models="pair", problems="0:8", n=True, max_new_tokens=64, device="cpu", dtype="float32",
               max_seq_len=1024)
@click.option("--modes", default="t0.8-p0.95,t0.2-p0.95", show_default=True)
@click.option("--draft-top-n", default=64, show_default=True,
              help="The draft's q for scoring: its N most likely tokens, top-k / top-p cut among them.")
@click.option("--draft-vocabs", default="0", show_default=True,
              help="Draft LM heads to score, by how many of the first token ids they cover (0 = all).")
@click.option("--batch-prompts", default=8, show_default=True, help="Prompts sampled together in one batch.")
def bench_acceptance_rules(target_dir, draft_dir, problems, n, max_new_tokens, modes, draft_top_n, draft_vocabs,
                           batch_prompts, device, dtype, max_seq_len, out) -> None:
    """Exact acceptance odds of the standard rule and of the Gumbel coupling on the same target
    trajectories (HumanEval prompts)."""
    from bass.app.bench.acceptance_rules import measure
    from bass.app.bench.environment import describe
    from bass.app.humaneval_problems import load_problems, select

    chosen = select(load_problems(), problems)
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
@bench_options(models="target", problems="0:16", max_new_tokens=128, device="auto", dtype="auto", max_seq_len=1024)
@click.option("--modes", default="greedy,t0.8-p0.95", show_default=True)
@click.option("--policies", default="0,4,auto", show_default=True, help="Draft-length policies compared.")
@click.option("--batch-invariant", is_flag=True, help="Run the target in its batch-invariant mode.")
def bench_invariance(target_dir, draft_dir, problems, max_new_tokens, modes, policies, batch_invariant, device,
                     dtype, max_seq_len, out) -> None:
    """Seeded requests alone vs in one batch, regular vs speculative: which sequences' tokens
    differ, and where they first do (numerics of batch-dependent kernels)."""
    from bass.app.bench.environment import describe
    from bass.app.bench.invariance import measure
    from bass.app.humaneval_problems import load_problems, select

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


@bench.command("speed")
@bench_options(models="pair", problems="0:16", max_new_tokens=128, device="auto", dtype="auto", max_seq_len=1024)
@click.option("--batches", default="1,8", show_default=True, help="Sequences per batch (one per prompt).")
@click.option("--policies", default="0,auto,bass,4", show_default=True, help="Draft-length policies; 0 = regular.")
@click.option("--mode", type=click.Choice(["greedy", "t0.8-p0.95"]), default="greedy", show_default=True)
@click.option("--services", is_flag=True, help="Through the real draft/target gRPC services (RPC cost included).")
@click.option("--separate-draft", is_flag=True,
              help="The draft in a service process of its own [in the target's, as `bass serve`]; without "
                   "--services the target runs in this process.")
@click.option("--attention", type=click.Choice(ATTENTION_BACKENDS), default=None,
              help="[triton on CUDA, pad on CPU]")
@click.option("--peak-tflops", type=float, help="Peak dense bf16 TFLOP/s for GPU utilization (H100 SXM: 989).")
@click.option("--repeats", default=3, show_default=True, help="Measured runs per configuration; the median is reported.")
@click.option("--batch-invariant", is_flag=True, help="Run the target in its batch-invariant mode (what it costs).")
@click.option("--draft-int8/--no-draft-int8", default=None,
              help="The draft's projections and LM head in weight-only int8 for few-row steps [on with the "
                   "Triton kernels].")
@click.option("--few-row-cuda/--no-few-row-cuda", default=True, show_default=True,
              help="Both models' steps of 1-16 rows through the CUDA kernel, layers fused (RunnerConfig.few_row_cuda).")
@click.option("--trace", is_flag=True, help="Keep the reported round's per-step trace (draft length, sequences, "
                                             "tokens, times) and the coordinator's garbage collections "
                                             "in each row.")
@click.option("--draft-device", help="The draft's device, e.g. cuda:1 (a GPU of its own) [the target's].")
@click.option("--lookup-tail", default=DEFAULT_LOOKUP_TAIL, show_default=True,
              help="Lookup tokens the target verifies after each proposal of a draft in its process (0-6; at most "
                   "6 at one or two sequences, 2 at three or four).")
@click.option("--programmatic-launch/--no-programmatic-launch", default=True, show_default=True,
              help="Kernels start while the one before them runs (Hopper and newer; never changes a value).")
def bench_speed(target_dir, draft_dir, problems, batches, policies, mode, max_new_tokens, services, separate_draft,
                device, dtype, attention, max_seq_len, peak_tflops, repeats, batch_invariant, draft_int8, few_row_cuda,
                trace, draft_device, lookup_tail, programmatic_launch, out) -> None:
    """End-to-end decoding speed: regular vs speculative, in-process or through the services.
    A policy `streamK[cC][wW][lL][nN]` is streamed speculation verifying up to K drafts a step
    (the draft's loop drafting C tokens a call, up to L ahead; a step waiting up to W ms for a
    sequence with no draft; positions without a draft filled from lookups of up to N tokens,
    n0 = off), for a draft on a GPU of its own (--separate-draft --draft-device cuda:1)."""
    from bass.app.bench.environment import describe
    from bass.app.bench.speed import measure
    from bass.app.humaneval_problems import load_problems, select

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    attention = attention or ("triton" if device.startswith("cuda") else "pad")
    batch_list = [int(b) for b in batches.split(",")]
    runner = dict(device=device, dtype=dtype, num_slots=max(batch_list), max_seq_len=max_seq_len, attention=attention,
                  few_row_cuda=few_row_cuda, programmatic_launch=programmatic_launch)
    prompts = [p["prompt"] for p in select(load_problems(), problems)]
    draft_runner = {**runner, "device": resolve_device(draft_device or device)}
    if not same_device(draft_runner["device"], device) and not separate_draft:
        raise click.UsageError("a draft on another device than the target's runs in a service of its own: "
                               "add --separate-draft")
    rows = measure(RunnerConfig(model_dir=target_dir, batch_invariant=batch_invariant, lookup_tail=lookup_tail,
                                **runner),
                   RunnerConfig(model_dir=draft_dir, int8_weights=draft_int8, **draft_runner), prompts,
                   batches=batch_list, policies=[p for p in policies.split(",") if p], mode=mode,
                   max_new_tokens=max_new_tokens, services=services, peak_tflops=peak_tflops, repeats=repeats,
                   progress=lambda m: click.echo(m, err=True), colocate=not separate_draft, trace=trace)
    result = {"benchmark": "speed", "environment": describe(device), "target": str(target_dir), "draft": str(draft_dir),
              "dtype": dtype, "attention": attention, "batch_invariant": batch_invariant, "draft_int8": draft_int8,
              "few_row_cuda": few_row_cuda, "draft_device": draft_device or device, "lookup_tail": lookup_tail,
              "programmatic_launch": programmatic_launch,
              "problems": problems, "results": rows}
    _emit_result(result, out)


@bench.command("hf")
@bench_options(models="model", problems="0:16", max_new_tokens=128, device="auto", dtype="auto")
@click.option("--batches", default="1,8", show_default=True)
@click.option("--static-compile", is_flag=True, help="Static cache + torch.compile (transformers' fast path).")
def bench_hf(model_dir, problems, batches, max_new_tokens, static_compile, device, dtype, out) -> None:
    """Baseline: transformers' greedy generate on the same prompts (ms per token per sequence)."""
    from bass.app.bench.environment import describe
    from bass.app.bench.hf_baseline import measure
    from bass.app.humaneval_problems import load_problems, select

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    prompts = [p["prompt"] for p in select(load_problems(), problems)]
    rows = [measure(Path(model_dir), prompts, batch=int(b), max_new_tokens=max_new_tokens, device=device, dtype=dtype,
                    static_compile=static_compile) for b in batches.split(",")]
    result = {"benchmark": "hf", "environment": describe(device), "model": str(model_dir), "dtype": dtype,
              "problems": problems, "results": rows}
    _emit_result(result, out)


@bench.command("steps")
@bench_options(dtype="bfloat16")
@click.option("--target", default="qwen2.5-coder-1.5b", show_default=True, help="Shape preset of the target.")
@click.option("--draft", default="qwen2.5-coder-0.5b", show_default=True, help="Shape preset of the draft.")
@click.option("--batches", default="1,8,32,64", show_default=True)
@click.option("--draft-lengths", default="1,2,3,4,6,8", show_default=True)
@click.option("--context", default=512, show_default=True, help="Tokens already cached per sequence.")
@click.option("--alpha", default=0.94, show_default=True,
              help="Per-token acceptance for the derived speculative figures (0.94: measured on the real pair).")
@click.option("--configs", default="pad:eager,triton:eager,triton:graphs", show_default=True,
              help="attention:eager|graphs pairs; attention is pad, triton, triton-invariant (the target "
                   "batch-invariant), triton-cuda (1-16-row products through the CUDA kernel where faster, an "
                   "int8 draft's layers fused) or triton-cuda-unfused; a '-serial' suffix turns programmatic "
                   "dependent launch off (e.g. triton-cuda-serial).")
@click.option("--repeats", default=30, show_default=True)
@click.option("--draft-int8", is_flag=True, help="The draft with int8 projections, as served (default: bf16).")
def bench_steps(target, draft, batches, draft_lengths, context, alpha, configs, dtype, repeats, draft_int8,
                out) -> None:
    """Measured step costs (random weights, real shapes) and derived speculative latency (GPU)."""
    import torch

    from bass.app.bench.environment import describe
    from bass.app.bench.steps import SHAPES, measure, shape_config, weight_bytes

    if not torch.cuda.is_available():
        raise click.UsageError("bench steps needs a CUDA device")
    for name in (target, draft):
        if name not in SHAPES:
            raise click.BadParameter(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    pairs = [(c.split(":")[0], c.split(":")[1] == "graphs") for c in configs.split(",")]
    rows = measure(target, draft, batches=[int(b) for b in batches.split(",")],
                   draft_lengths=[int(k) for k in draft_lengths.split(",")], context=context, alpha=alpha,
                   configs=pairs, dtype=dtype, repeats=repeats, progress=lambda m: click.echo(m, err=True),
                   draft_int8=draft_int8)
    props = torch.cuda.get_device_properties(0)
    floor_ms = {name: weight_bytes(shape_config(name), dtype) / 4.28e12 * 1e3 for name in (target, draft)}
    result = {"benchmark": "steps", "environment": describe("cuda"), "target": target, "draft": draft, "dtype": dtype,
              "weights_floor_ms_at_4.28TBps": {k: round(v, 4) for k, v in floor_ms.items()},
              "gpu_memory_gb": round(props.total_memory / 2**30, 1), "alpha_for_derived": alpha,
              "draft_int8": draft_int8, "note": "random weights at real shapes; speculative figures are derived from measured step costs "
                      "and alpha", "results": rows}
    _emit_result(result, out)


def _parse_loads(value: str | None, kind: str):
    from bass.app.bench.serve import Load

    if value is None:
        return ()
    try:
        return tuple(Load(kind, float(v)) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, e.g. 1,2,4{',inf' if kind == 'rate' else ''}")


@bench.command("serve")
@bench_options(problems="all", n=True, out=None)
@click.option("--address", help="host:port of a running coordinator (or --serve, or --openai).")
@click.option("--openai", "openai_url",
              help="Base URL of a running OpenAI-compatible server (BASS's --http-port front, vLLM, ...), e.g. "
                   "http://127.0.0.1:8000/v1: the same load through streamed /v1/completions.")
@click.option("--serve", "start_server", is_flag=True,
              help="Start `bass serve` with the model flags below (port: any free one) and stop it at the end.")
@click.option("--rates", help="Open loop: Poisson arrivals at these requests/s, e.g. 1,2,4,8,16,inf (inf: all at once).")
@click.option("--concurrency", help="Closed loop: this many clients, each sending its next request when one ends (e.g. 1,8,64).")
@click.option("--num-requests", type=int, help="Requests per run [100 unless --duration].")
@click.option("--duration", type=float, help="Seconds of arrivals per run (with --num-requests: whichever ends first).")
@click.option("--prompts-file", type=click.Path(exists=True, dir_okay=False),
              help="JSONL, one {\"prompt\": ...} per line [HumanEval's prompts].")
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
def bench_serve(ctx, address, openai_url, start_server, rates, concurrency, num_requests, duration, prompts_file, problems, n,
                new_tokens, temperature, top_p, seed, unseeded, slo_ttft_ms, slo_tpot_ms, compare_regular, check,
                timeout_s, progress, out_dir, **_) -> None:
    """Load benchmark through the public API: TTFT, TPOT, ITL, throughput, goodput, errors, correctness."""
    from click.core import ParameterSource

    from bass.app.bench.environment import describe
    from bass.app.bench.serve import ServeBenchConfig, run
    from bass.app.bench.serve_report import markdown_table, plot
    from bass.app.bench.serve_stats import Slo
    from bass.app.bench.serve_workload import load_prompts
    from bass.app.launcher import launch, public_address, stop_all

    if sum(map(bool, (address, openai_url, start_server))) != 1:
        raise click.UsageError("give exactly one of --address, --openai or --serve")
    model_flags = [o.name for o in serve.params if ctx.get_parameter_source(o.name) == ParameterSource.COMMANDLINE]
    if (address or openai_url) and model_flags:
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
                server = serve_config(ctx, default_port=0)
                processes = launch(server, echo=lambda m: click.echo(m, err=True))
            except BassError as e:
                fail(e)
            address = public_address(processes)
            device = server.target.device
        result = run(openai_url or address, config, prompts, show_progress=progress,
                     log=lambda m: click.echo(m, err=True), protocol="openai" if openai_url else "grpc")
    except ConnectionError as e:
        raise click.ClickException(str(e)) from None
    finally:
        stop_all(processes)
    environment = describe(device)
    if not start_server:  # the service may run beside this client: name the GPU it would share
        import torch

        if torch.cuda.is_available():
            environment["gpu_on_client_machine"] = torch.cuda.get_device_name(0)
    result = {"benchmark": "serve", "environment": environment, "address": openai_url or address,
              "protocol": "openai" if openai_url else "grpc",
              "server": json.loads(json.dumps({k: asdict(server)[k] for k in ("target", "draft", "coordinator", "replicas")},
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
            click.echo("matplotlib is missing: no serve.png "
                       "(python -m bass.app.bench.serve_report serve.json draws it)", err=True)


COMMANDS = [bench]
