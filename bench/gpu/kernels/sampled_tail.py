"""What the sampled part of a step's tail costs on the GPU, as CUDA graphs replay it (issue #35:
sampled within 15% of greedy): for R logit rows over the real vocabulary (151,936), the greedy
argmax against the sampled race (temperature 0.8, top-p 0.95, keyed Gumbel noise) with its cut
from each row's top-256 window (the path before race_first; its stages too) and with the race
first (kernels/triton_race_first.race_first, what `race_unsynced` runs since). Logits shaped like
a code model's (a few dozen plausible tokens, a light tail), and rows with a heavier tail
(their winner is outside the nucleus more often, from deep in the tail), and flat rows whose
nucleus holds thousands of tokens (race_first's exact search, _exact_cut_kernel, decides a row
whose winner falls outside it). Also checks race_first's tokens against the exact race.

    python bench/gpu/kernels/sampled_tail.py OUT.json [ROWS]     # ROWS e.g. 1,8,32,64,256
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from bass.app.bench.environment import describe
from bass.core.config import SamplingParams
from bass.engine import sampling
from bass.engine.sampling import RowParams, noise_keys
from bass.kernels.timing import graph_us

VOCAB = 151936


def logits_like_code(rows: int, flatter: int, device) -> torch.Tensor:
    """Rows of a peaked head over a light tail (~0.05% of the mass); the first `flatter` rows'
    head is lower, their tail heavier (~20%): winners from deep in the tail."""
    gen = torch.Generator(device=device).manual_seed(rows)
    logits = torch.randn(rows, VOCAB, device=device, generator=gen) * 1.5
    head = torch.linspace(16, 6, 40, device=device)
    logits[:, :40] += head
    logits[:flatter, :40] -= 5
    return logits


def windowed(logits, params, keys):
    """The cut from each row's window, then the race (race_unsynced before race_first)."""
    cut, redo, _ = sampling._windowed_cut(sampling._scaled(logits, params), params.top_k, params.top_p,
                                          sampling.CUT_WINDOW)
    return sampling._race_with_cut(logits, params, cut, keys), redo


def eager_us(fn, repeats: int = 20) -> float:
    """Median host-clock time of fn() between two synchronizations: for work with a host sync in
    it (a redo of flagged rows), which a CUDA graph cannot hold."""
    times = []
    for i in range(repeats + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def raced_with_redo(logits, params, keys):
    """What a verification's race costs the target, as it runs it: race_unsynced, then where it
    flags rows (builds before every row was decided on the device) the exact race of those rows."""
    tokens, redo = sampling.race_unsynced(logits, params, keys)
    if redo is not None and bool(redo.any()):
        index = redo.nonzero().squeeze(1)
        tokens[index] = sampling.race(logits[index], params.take(index), keys[index])
    return tokens, redo


def main() -> None:
    from bass.kernels.triton_race_first import race_first

    out = sys.argv[1]
    batches = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32,64,256").split(",")]
    device = torch.device("cuda")
    results = {"environment": describe("cuda"), "vocab": VOCAB, "rows": {}}
    cases = [(flatter, 0.95) for flatter in (0, None)] + [("wide", 0.95), ("wide", 0.5)]
    for rows in batches:
        for flatter, top_p in cases:
            if flatter == "wide":  # flat rows: nuclei of thousands of tokens, the exact search's rows
                gen = torch.Generator(device=device).manual_seed(rows)
                logits = torch.randn(rows, VOCAB, device=device, generator=gen)
            else:
                flatter = max(1, rows // 4) if flatter is None else flatter
                logits = logits_like_code(rows, flatter, device)
            params = RowParams.build([SamplingParams(temperature=0.8, top_p=top_p)] * rows, device)
            keys = noise_keys(range(1000, 1000 + rows), list(range(rows))).to(device)
            scaled = sampling._scaled(logits, params)
            first = lambda: race_first(logits, params.divisor, params.top_k, params.top_p, keys,  # noqa: E731
                                       params.greedy, params.truncating)
            stages = {
                "argmax (greedy)": lambda: logits.argmax(dim=-1),
                "scale": lambda: sampling._scaled(logits, params),
                "logsumexp": lambda: torch.logsumexp(scaled, dim=-1, keepdim=True),
                "topk 256": lambda: scaled.topk(sampling.CUT_WINDOW, dim=-1),
                "windowed cut": lambda: sampling._windowed_cut(scaled, params.top_k, params.top_p,
                                                               sampling.CUT_WINDOW),
                "windowed race (before)": lambda: windowed(logits, params, keys),
                "race_first": first,
            }
            row = {name: round(graph_us(fn), 1) for name, fn in stages.items()}
            row["race_unsynced + host redo, eager"] = round(eager_us(lambda: raced_with_redo(logits, params, keys)), 1)
            exact = sampling.race(logits, params, keys)
            tokens, redo = raced_with_redo(logits, params, keys)
            row["rows redone on the host"] = 0 if redo is None else int(redo.sum())
            old, _ = windowed(logits, params, keys)
            winner = sampling._race_with_cut(logits, params, torch.full_like(params.divisor, float("-inf")), keys)
            row["race_unsynced (+ redo) == exact race (rows)"] = int((tokens == exact).sum())
            row["windowed == exact race (rows)"] = int((old == exact).sum())
            row["winner outside the cut (rows)"] = int((winner != exact).sum())
            key = f"{rows}" + (f" (wide, top-p {top_p})" if flatter == "wide" else f" ({flatter} flatter)" if flatter
                               else "")
            results["rows"][key] = row
            print(key, json.dumps(row), flush=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
