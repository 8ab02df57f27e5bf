"""What `bass bench serve` sends and when: prompts, request specs and arrival times.

Everything random here comes from a `random.Random` seeded by the caller, so the same flags give
the same requests at the same offsets on every run (and the speculative and regular runs of one
rate replay one schedule).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass(frozen=True)
class RequestSpec:
    """One request as sent; equal specs are the same request (what the correctness check compares)."""

    prompt: Prompt
    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    speculate: bool = True

    @property
    def deterministic(self) -> bool:
        """Greedy, or sampled with a seed: its answer must not depend on what else runs."""
        return self.temperature == 0 or self.seed is not None

    def regular(self) -> "RequestSpec":
        return replace(self, speculate=False)


@dataclass(frozen=True)
class Arrival:
    offset_s: float  # after the run's start
    spec: RequestSpec


def load_prompts(prompts_file: Path | None, problems: str | None = None) -> list[Prompt]:
    """HumanEval's prompts (optionally a selection such as '0:32'), or a JSONL file with one
    {"prompt": ...} object per line ("id" optional)."""
    if prompts_file is None:
        from bass.app.humaneval_problems import load_problems, select

        return [Prompt(p["task_id"], p["prompt"]) for p in select(load_problems(), problems)]
    prompts = []
    for number, line in enumerate(Path(prompts_file).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["prompt"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{prompts_file}:{number}: expected a JSON object with a 'prompt' string") from None
        if not isinstance(text, str) or not text:
            raise ValueError(f"{prompts_file}:{number}: 'prompt' must be a non-empty string")
        prompts.append(Prompt(str(obj.get("id", f"line{number}")), text))
    if not prompts:
        raise ValueError(f"{prompts_file}: no prompts")
    return prompts


def request_specs(prompts: list[Prompt], count: int, *, n: int, max_new_tokens: int, temperature: float,
                  top_p: float, seed: int, seeded: bool) -> list[RequestSpec]:
    """`count` requests cycling through the prompts in a seeded shuffled order. A sampled
    request's seed is fixed per prompt (not per request), so repeated prompts are repeated
    requests whose answers must agree, and the references stay few."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    specs = []
    for i in range(count):
        k = order[i % len(order)]
        request_seed = (seed * 1_000_003 + k) % 2**63 if seeded and temperature > 0 else None
        specs.append(RequestSpec(prompts[k], n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_p=top_p, seed=request_seed))
    return specs


def poisson_offsets(rate: float, rng: random.Random, *, count: int | None = None,
                    duration_s: float | None = None) -> list[float]:
    """Arrival offsets of a Poisson process at `rate` requests/s (exponential gaps), until
    `count` arrivals or `duration_s`, whichever comes first. rate = inf: all at offset 0."""
    if count is None and duration_s is None:
        raise ValueError("give count or duration_s")
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if math.isinf(rate):
        if count is None:
            raise ValueError("rate inf (all at once) needs a count, not only a duration")
        return [0.0] * count
    offsets, t = [], 0.0
    while count is None or len(offsets) < count:
        t += rng.expovariate(rate)
        if duration_s is not None and t > duration_s:
            break
        offsets.append(t)
    return offsets


def open_loop_schedule(rate: float, prompts: list[Prompt], *, seed: int, count: int | None,
                       duration_s: float | None, **spec_options) -> list[Arrival]:
    """The arrivals of one open-loop run; the seed mixes in the rate so that each rate has its
    own (repeatable) gaps."""
    offsets = poisson_offsets(rate, random.Random(f"{seed}:{rate}"), count=count, duration_s=duration_s)
    specs = request_specs(prompts, len(offsets), seed=seed, **spec_options)
    return [Arrival(t, s) for t, s in zip(offsets, specs)]
