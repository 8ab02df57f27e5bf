"""One request: `bass generate` (in this process, no services) and `bass client` (to a
running coordinator)."""

from __future__ import annotations

import json
import time

import click

from bass.app.cli.options import parse_draft_length
from bass.core.config import (ATTENTION_BACKENDS, DTYPES, RunnerConfig, SamplingParams, SchedulerConfig,
                              resolve_device, resolve_dtype)
from bass.core.errors import BassError


def _parse_ids(_ctx, _param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(t) for t in value.replace(" ", "").split(",") if t)
    except ValueError:
        raise click.BadParameter("expected comma-separated integers, e.g. 1,2,3") from None


@click.command("generate")
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
@click.option("--draft-length", default="auto", show_default=True, callback=parse_draft_length,
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
    from bass.app.local import build_local_scheduler
    from bass.coordinator.requests import GenerationRequest

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


@click.command("client")
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

    from bass.app.client import BassClient

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



COMMANDS = [generate, client]
