"""Time the demo request (HumanEval/2, n = 8, T = 0.8, top-p 0.95) against a running coordinator.

Used on the GPU machine to compare launchers (`bass serve` and `bass up` on Ray) on the same
request: one warm-up, then `--repeats` runs each with speculation on and off; reports the
median wall time, ms per token per sequence and the service's own step statistics as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bass.app.bench.environment import describe
from bass.app.humaneval_problems import load_problems
from bass.app.client import BassClient


def run(client: BassClient, prompt: str, *, n: int, max_new_tokens: int, speculate: bool) -> dict:
    t0 = time.perf_counter()
    r = client.generate(prompt, n=n, max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95, speculate=speculate)
    wall = time.perf_counter() - t0
    longest = max(len(s.token_ids) for s in r.sequences)
    return {"wall_s": wall, "tokens": sum(len(s.token_ids) for s in r.sequences), "longest": longest,
            "ms_per_token_per_sequence": 1000 * wall / longest, "steps": r.stats.steps,
            "acceptance_rate": r.stats.acceptance_rate if r.stats.draft_tokens else None,
            "service_time_ms": r.stats.time_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--address", required=True)
    ap.add_argument("--label", required=True, help="What served it, e.g. 'bass serve' or 'bass up (Ray, 1 GPU)'.")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    prompt = next(p["prompt"] for p in load_problems() if p["task_id"] == "HumanEval/2")
    rows = {}
    with BassClient(args.address) as client:
        for speculate in (False, True):
            run(client, prompt, n=args.n, max_new_tokens=args.max_new_tokens, speculate=speculate)  # warm-up
            runs = [run(client, prompt, n=args.n, max_new_tokens=args.max_new_tokens, speculate=speculate)
                    for _ in range(args.repeats)]
            median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
            rows["speculative" if speculate else "regular"] = {
                **median, "wall_s_all_runs": [round(r["wall_s"], 4) for r in runs],
                "median_ms_per_token_per_sequence": statistics.median(r["ms_per_token_per_sequence"] for r in runs)}
    result = {"benchmark": "demo-request", "label": args.label, "address": args.address, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "environment": describe("client"), "results": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
