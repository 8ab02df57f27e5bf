"""Where a sampled step's sampling time goes (issue #12: sampled within 15% of greedy).

For R logit rows over the real vocabulary (151,936), T = 0.8 and top-p 0.95 over logits shaped
like a code model's (a few dozen plausible tokens, a long tail), times each stage of
engine/sampling.race on its own (CUDA events around 20 calls, median of 5) and the whole race
with a host clock (its syncs included), against a greedy argmax.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bass.app.bench.environment import describe
from bass.core.config import SamplingParams
from bass.engine import sampling
from bass.engine.sampling import RowParams, noise_keys

VOCAB = 151936


def gpu_us(fn, calls: int = 20, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def wall_us(fn, repeats: int = 30) -> float:
    times = []
    for i in range(repeats + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,40,64")
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    results = {"env": describe("cuda"), "vocab": VOCAB, "rows": {}}
    for rows in [int(r) for r in args.rows.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(rows)
        logits = torch.randn(rows, VOCAB, device=dev, generator=gen) * 2
        logits[:, :40] += torch.linspace(12, 4, 40, device=dev)  # a code model's few likely tokens
        params = RowParams.build([SamplingParams(temperature=0.8, top_p=0.95)] * rows, dev)
        keys = noise_keys([7] * rows, list(range(rows))).to(dev)
        scaled = sampling._scaled(logits, params)
        lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
        top = scaled.topk(sampling.CUT_WINDOW, dim=-1).values
        cut = sampling.truncation_cut(scaled, params.top_k, params.top_p)
        cut = torch.where(params.truncating, cut, torch.full_like(cut, float("-inf")))
        stages = {
            "argmax (greedy)": lambda: logits.argmax(dim=-1),
            "scale": lambda: sampling._scaled(logits, params),
            "logsumexp": lambda: torch.logsumexp(scaled, dim=-1, keepdim=True),
            "topk 256": lambda: scaled.topk(sampling.CUT_WINDOW, dim=-1),
            "cut in window": lambda: sampling._cut_in_window(top, lse, params.top_k, params.top_p),
            "truncation_cut (with its sync)": lambda: sampling.truncation_cut(scaled, params.top_k, params.top_p),
            "gumbel race kernel": lambda: sampling._race_with_cut(logits, params, cut, keys),
            "race (all)": lambda: sampling.race(logits, params, keys),
        }
        row = {}
        for name, fn in stages.items():
            try:
                row[name] = round(gpu_us(fn), 1)
            except Exception as exc:  # an older build without this stage's signature
                row[name] = f"{type(exc).__name__}"
        row["race wall (host clock)"] = round(wall_us(lambda: sampling.race(logits, params, keys)), 1)
        row["argmax wall (host clock)"] = round(wall_us(lambda: logits.argmax(dim=-1)), 1)
        row["RowParams.build + noise_keys wall"] = round(wall_us(lambda: (
            RowParams.build([SamplingParams(temperature=0.8, top_p=0.95)] * rows, dev),
            noise_keys([7] * rows, list(range(rows))).to(dev))), 1)
        results["rows"][rows] = row
        print(f"rows={rows}: " + json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
