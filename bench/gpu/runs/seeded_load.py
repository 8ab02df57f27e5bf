"""Seeds under load, through a running coordinator: the same seeded requests sent alone (with
and without speculation) and then many times concurrently, mixed with each other; every
answer is compared token for token with the first alone-answer.

Used on the GPU machine against `bass serve` (issue #15): reports how many sequences differ in
each phase, where they first differ, and the wall time, as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

from bass.app.bench.environment import describe
from bass.app.humaneval_problems import load_problems
from bass.app.bench.invariance import first_difference
from bass.app.client import BassClient


def request_specs(count: int, max_new_tokens: int) -> list[dict]:
    """Seeded sampled requests (T 0.8 top-p 0.95 and T 0.2, n = 2) and greedy ones, round robin."""
    prompts = [p["prompt"] for p in load_problems()]
    kinds = [dict(temperature=0.8, top_p=0.95, n=2), dict(temperature=0.2, top_p=0.95, n=2), dict(temperature=0.0)]
    return [dict(prompt=prompts[i % len(prompts)], seed=1000 + i, max_new_tokens=max_new_tokens, ignore_eos=True,
                 **kinds[i % len(kinds)]) for i in range(count)]


def tokens(client: BassClient, spec: dict, speculate: bool = True) -> list[list[int]]:
    spec = dict(spec)
    prompt = spec.pop("prompt")
    return [list(s.token_ids) for s in client.generate(prompt, speculate=speculate, **spec).sequences]


def mismatches(reference: list[list[int]], got: list[list[int]]) -> list[int]:
    return [d for d in (first_difference(r, g) for r, g in zip(reference, got, strict=True)) if d is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--address", required=True)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    specs = request_specs(args.requests, args.max_new_tokens)
    report = {"benchmark": "seeded-load", "environment": describe("cuda"), "requests": args.requests,
              "rounds": args.rounds, "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens}
    with BassClient(args.address) as client:
        started = time.perf_counter()
        reference = [tokens(client, s) for s in specs]
        alone_regular = [mismatches(r, tokens(client, s, speculate=False)) for r, s in zip(reference, specs)]
        report["alone_regular_vs_alone_speculative"] = {
            "sequences": sum(len(r) for r in reference), "differ": sum(len(m) for m in alone_regular),
            "first_difference_positions": sorted(p for m in alone_regular for p in m)[:20]}
        rng = random.Random(0)
        loaded = []
        with ThreadPoolExecutor(args.concurrency) as pool:
            for _ in range(args.rounds):
                order = list(range(len(specs)))
                rng.shuffle(order)
                answers = list(pool.map(lambda i: (i, tokens(client, specs[i], speculate=rng.random() < 0.8)), order))
                loaded += [mismatches(reference[i], got) for i, got in answers]
        report["under_load_vs_alone"] = {
            "sequences": sum(len(reference[i % len(specs)]) for i in range(len(specs) * args.rounds)),
            "differ": sum(len(m) for m in loaded),
            "first_difference_positions": sorted(p for m in loaded for p in m)[:20]}
        report["wall_time_s"] = round(time.perf_counter() - started, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "environment"}))


if __name__ == "__main__":
    main()
