"""`make demo`: the services on the bundled model pair, one real multi-sequence request.

Starts target, draft and coordinator as local processes (GPU if there is one) and streams a
HumanEval prompt with n = 8 sampled sequences through the public gRPC API, first with
speculation off (the baseline; it also gives the coordinator its first cost measurements),
then with it on; prints the completions and compares speed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import click

from bass.app.client import FINISH_REASON_NAMES, BassClient
from bass.app.humaneval_problems import load_problems
from bass.app.launcher import launch, stop_all
from bass.core.config import CoordinatorConfig, SchedulerConfig, ServeConfig, WorkerServiceConfig

PROBLEM = "HumanEval/2"  # truncate_number: short prompt, short answer


@dataclass
class RunSummary:
    texts: dict[int, str]
    reasons: dict[int, str]
    tokens: int
    seconds: float
    acceptance: float
    steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def stream_request(client: BassClient, prompt: str, *, n: int, max_new_tokens: int, speculate: bool,
                   label: str) -> RunSummary:
    texts: dict[int, str] = {i: "" for i in range(n)}
    reasons: dict[int, str] = {}
    tokens, t0, stats = 0, time.perf_counter(), None
    live = sys.stderr.isatty()  # redraw one line on a terminal; a line every few seconds in a log
    last_line = 0.0
    # No seed: a seeded request pays one extra draft forward per step so that its text does not
    # depend on draft lengths (README, "Lossless by construction"); the demo compares raw speed.
    for message in client.stream_raw(prompt, n=n, max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95,
                                     speculate=speculate):
        for d in message.deltas:
            texts[d.index] += d.text
            tokens += len(d.token_ids)
            if d.finish_reason:
                reasons[d.index] = FINISH_REASON_NAMES[d.finish_reason]
        if message.HasField("stats"):
            stats = message.stats
        now = time.perf_counter()
        if live or now - last_line > 5 or stats is not None:
            last_line = now
            click.echo(f"{chr(13) if live else ''}  {label}: {tokens:4d} tokens, {len(reasons)}/{n} sequences done, "
                       f"{now - t0:5.1f} s", nl=not live, err=True)
    if live:
        click.echo("", err=True)
    return RunSummary(texts, reasons, tokens, time.perf_counter() - t0, stats.acceptance_rate, stats.steps)


def run_demo(target_dir, draft_dir, device: str, dtype: str, n: int, max_new_tokens: int) -> None:
    problem = next(p for p in load_problems() if p["task_id"] == PROBLEM)
    worker = dict(device=device, dtype=dtype, num_slots=max(n, 8), max_seq_len=1024)
    config = ServeConfig(target=WorkerServiceConfig(model_dir=target_dir, **worker),
                         draft=WorkerServiceConfig(model_dir=draft_dir, **worker),
                         coordinator=CoordinatorConfig(port=0, scheduler=SchedulerConfig(max_batch_size=max(n, 8))))
    click.echo(f"Starting the services on {device} ({dtype}); loading the models takes a moment...", err=True)
    t0 = time.perf_counter()
    processes = launch(config, echo=lambda line: click.echo(f"  ready: {line}", err=True))
    click.echo(f"Services up in {time.perf_counter() - t0:.0f} s.\n", err=True)
    try:
        with BassClient(processes[-1].address, timeout_s=3600) as client:
            click.echo(f"Prompt ({PROBLEM}):\n{problem['prompt']}", err=True)
            click.echo(f"Regular decoding first, as the baseline: {n} sampled completions (T=0.8, top-p 0.95, "
                       f"{max_new_tokens} new tokens)...", err=True)
            regular = stream_request(client, problem["prompt"], n=n, max_new_tokens=max_new_tokens, speculate=False,
                                     label="regular")
            click.echo("The same request with speculation (BASS, draft length chosen from measured costs)...",
                       err=True)
            spec = stream_request(client, problem["prompt"], n=n, max_new_tokens=max_new_tokens, speculate=True,
                                  label="speculative")
            for i in range(n):
                click.echo(f"\n--- completion {i} ({spec.reasons.get(i)}) ---")
                click.echo(spec.texts[i].rstrip())
    finally:
        stop_all(processes)
    click.echo("\n=== speed ===")
    click.echo(f"speculative:        {spec.tokens} tokens in {spec.seconds:.1f} s = {spec.tokens_per_s:.1f} tokens/s, "
               f"{spec.steps} steps, acceptance rate {spec.acceptance:.0%}")
    click.echo(f"regular decoding:   {regular.tokens} tokens in {regular.seconds:.1f} s = "
               f"{regular.tokens_per_s:.1f} tokens/s, {regular.steps} steps")
    speedup = spec.tokens_per_s / regular.tokens_per_s
    click.echo(f"speedup: {speedup:.2f}x")
    if speedup < 1 and not device.startswith("cuda"):
        click.echo("(On a small CPU, verifying n x (k+1) tokens costs almost k+1 times one token, so speculation "
                   "does not pay at this batch size; on a GPU the target's cost hardly depends on k: see "
                   "bench/results/README.md.)")
    sys.stdout.flush()
