"""The `bass` command line."""

from __future__ import annotations

import json
import logging
import sys
import time

import click

from bass.config import DraftLengthConfig, RunnerConfig, SamplingParams, SchedulerConfig, DTYPES, ATTENTION_BACKENDS
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
@click.option("--draft-length", default="bass", show_default=True, callback=_parse_draft_length,
              help="bass | adaptive | fixed | an integer k (0 = regular decoding).")
@click.option("--draft-top-n", default=64, show_default=True, help="Size of the draft's compact q.")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--attention", type=click.Choice(ATTENTION_BACKENDS), default="pad", show_default=True)
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
    out["stats"]["load_time_s"] = round(load_s, 3)
    if as_json:
        click.echo(json.dumps(out))
        return
    for s in out["sequences"]:
        click.echo(f"--- sequence {s['index']} ({s['finish_reason']}, {len(s['token_ids'])} tokens)")
        click.echo(s["text"])
    click.echo(f"--- stats: {json.dumps(out['stats'])}")


if __name__ == "__main__":
    main()


@main.group()
def bench() -> None:
    """Measurements; results are JSON (with device, model and commit) for bench/results/."""


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
    from bass.bench.acceptance import MODES, measure
    from bass.bench.environment import describe
    from bass.bench.humaneval import load_problems, select

    chosen = select(load_problems(), None if problems == "all" else problems)
    mode_list = [m for m in modes.split(",") if m]
    unknown = [m for m in mode_list if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown modes {unknown}; known: {sorted(MODES)}", param_hint="--modes")
    runner = dict(device=device, dtype=dtype, num_slots=batch_prompts * n, max_seq_len=max_seq_len)
    rows = measure(RunnerConfig(model_dir=target_dir, **runner), RunnerConfig(model_dir=draft_dir, **runner),
                   [p["prompt"] for p in chosen], n=n, max_new_tokens=max_new_tokens,
                   draft_lengths=[d for d in draft_lengths.split(",") if d], modes=mode_list,
                   batch_prompts=batch_prompts, progress=lambda msg: click.echo(msg, err=True))
    result = {"benchmark": "acceptance", "environment": describe(device),
              "target": str(target_dir), "draft": str(draft_dir), "dtype": dtype,
              "problems": f"HumanEval {problems} ({len(chosen)})", "results": rows}
    text = json.dumps(result, indent=2)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    click.echo(text)
