#!/usr/bin/env python3
"""µs a layer of decode / verify attention as the product runs it: a whole forward's layers back
to back in one CUDA graph, each layer over its own KV cache, with context lengths that are only
bounds on the host (`ctx_lens_are_bounds`, as engine/graphs.py captures them) unless --exact.

The attention sweep (attention_sweep.py) times one call with exact lengths; a forward's profile
(profiling/forward_kernels.py) times eager calls, which plan without split-KV at 512-token
contexts. Neither is the launch that a CUDA-graph step replays, which this script times.

--baseline FILE times another copy of kernels/triton_attention.py beside the tree's (e.g.
`git show REV:kernels/triton_attention.py > /tmp/before.py`), alternated in rounds, and checks
that both give the same output within bf16 rounding.

Usage: python bench/gpu/kernels/attention_layers.py [--baseline FILE] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_sweep  # noqa: E402,F401  (maps bass.* onto the source tree when not installed)
from graph_timing import graph_us  # noqa: E402

from bass.kernels.batch import RaggedBatch, SequenceChunk  # noqa: E402

MODELS = {"1.5b": (12, 2, 128, 28), "0.5b": (14, 2, 64, 24)}  # heads, kv heads, head_dim, layers
# Launch plans of the tree's kernel (--variants): the heuristics' pick, and batch-invariant plans
# (a fixed row block, every tile masked; one pass, or splits of a fixed number of keys).
VARIANTS = {
    "default": {},
    "inv-1pass": dict(block_m=64, num_splits=1, mask_every_tile=True),
    "inv-split64": dict(block_m=64, split_keys=64, mask_every_tile=True),
    "inv-split128": dict(block_m=64, split_keys=128, mask_every_tile=True),
    "inv-split256": dict(block_m=64, split_keys=256, mask_every_tile=True),
    "inv16-split64": dict(block_m=16, split_keys=64, mask_every_tile=True),
    "inv16-split128": dict(block_m=16, split_keys=128, mask_every_tile=True),
    "invariant": dict(batch_invariant=True),  # the mode's plan
    # Split counts for bound contexts (the graphs' plan takes 8): since f68a38e the merge loads
    # all splits' partials at once, so its cost no longer grows with their number.
    "splits2": dict(num_splits=2),
    "splits4": dict(num_splits=4),
    "splits16": dict(num_splits=16),
    "n32": dict(block_n=32),
    "n32-splits16": dict(block_n=32, num_splits=16),
}
CAPACITY = 2048  # the cache length a graph is captured for (its contexts' bound)


def load_kernel(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_case(model: str, batch_size: int, q_len: int, spread: str, exact: bool, seed: int = 0):
    heads, kv_heads, head_dim, layers = MODELS[model]
    rng = random.Random(seed)
    ctxs = [512] * batch_size if spread == "equal" else [rng.randint(64, 1500) for _ in range(batch_size)]
    chunks = [SequenceChunk(slot=b, start=c - q_len, tokens=[0] * q_len, logit_rows=0) for b, c in enumerate(ctxs)]
    batch = RaggedBatch.build(chunks, "cuda")
    if not exact:
        batch = replace(batch, max_ctx=CAPACITY, ctx_lens_list=[CAPACITY] * batch_size, ctx_lens_are_bounds=True)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (layers, batch_size, CAPACITY, kv_heads, head_dim)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(batch.num_tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, batch, head_dim ** -0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another triton_attention.py to time beside the tree's")
    ap.add_argument("--models", default="1.5b,0.5b")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--q-lens", default="1,4")
    ap.add_argument("--spreads", default="equal,mixed")
    ap.add_argument("--exact", action="store_true", help="exact host-side lengths (eager plans), not bounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="default", help="launch plans of the tree's kernel: " + ", ".join(VARIANTS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    root = Path(__file__).resolve().parents[3]
    tree = load_kernel(root / "kernels" / "triton_attention.py", "_attn_tree")
    kernels = {name: (tree, VARIANTS[name]) for name in args.variants.split(",")}
    if args.baseline:
        kernels = {"baseline": (load_kernel(args.baseline, "_attn_baseline"), {}), **kernels}
    rows = []
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  bounds={not args.exact}  "
          f"us a layer, median of {args.rounds} rounds")
    for model in args.models.split(","):
        for batch_size in map(int, args.batches.split(",")):
            for q_len in map(int, args.q_lens.split(",")):
                for spread in args.spreads.split(","):
                    q, k, v, batch, scale = make_case(model, batch_size, q_len, spread, args.exact)
                    layers = k.shape[0]
                    arrivals = {name: torch.zeros(1 << 16, dtype=torch.int32, device="cuda") for name in kernels}
                    fns = {name: (lambda m=m, kw=kw, a=arrivals[name]: [
                        m.attend_triton(q, k[i], v[i], batch, scale, arrivals=a, **kw) for i in range(layers)])
                        for name, (m, kw) in kernels.items()}
                    outs = {name: fn()[-1] for name, fn in fns.items()}
                    ref = next(iter(outs.values())).float()
                    err = max((o.float() - ref).abs().max().item() for o in outs.values())
                    times = {name: [] for name in kernels}
                    for _ in range(args.rounds):
                        for name, fn in fns.items():
                            times[name].append(graph_us(fn, calls=layers))
                    med = {name: statistics.median(t) for name, t in times.items()}
                    row = {"model": model, "batch": batch_size, "q_len": q_len, "spread": spread,
                           "us_per_layer": med, "rounds": times, "max_abs_diff": err}
                    rows.append(row)
                    cells = "  ".join(f"{name} {us:6.2f}" for name, us in med.items())
                    print(f"{model:>5} b={batch_size:<3} q={q_len} {spread:>5}: {cells}  (max |diff| {err:.2e})",
                          flush=True)
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "bounds": not args.exact, "capacity": CAPACITY}
        args.out.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
