"""What programmatic dependent launch saves a forward, on the GPU alone: the int8 0.5B draft's
fused decode layers (the served draft) and the bf16 1.5B target, random weights, one token a
sequence at 512-token contexts. Each forward is captured in a CUDA graph and replayed back to
back (the host queues replays far faster than the GPU runs them), so the time between two events
over REPLAYS replays is GPU time only: kernels and the boundaries between them, no host work.

For each model and batch, the launches are timed in four settings, alternated ROUNDS times on the
same model (same weights, same memory): all serial; the products programmatic (a product starts
while the kernel before it runs and loads its first weights); the attention programmatic; both
(what RunnerConfig.programmatic_launch does).

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kernels/programmatic_launch.py OUT.json [ROLE,...]
ROLE: draft-fused (default), target-cuda (the target's layers fused around the few-row kernel for
steps of up to 16 rows), target-cuda-unfused (its 1-16-row products through the kernel where they
time faster, layers unfused), target (cuBLAS products: only the attention can overlap).
QS: tokens a sequence, comma-separated (default 1; 4 is a k = 3 verification's shape).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys

import torch

from bass.app.bench.steps import StepTimer, random_transformer, shape_config
from bass.kernels.batch import RaggedBatch
from bass.kernels.timing import graph_us

MODELS = {"draft-fused": ("qwen2.5-coder-0.5b", True, True, True),
          "target-cuda": ("qwen2.5-coder-1.5b", False, True, True),
          "target-cuda-unfused": ("qwen2.5-coder-1.5b", False, True, False),
          "target": ("qwen2.5-coder-1.5b", False, False, False)}  # (shapes, int8, few-row CUDA kernel, fused layers)
SETTINGS = {"serial": (False, False), "products": (True, False), "attention": (False, True), "both": (True, True)}
REPLAYS, ROUNDS, SAMPLES = 20, 4, 15


def set_programmatic(model, products: bool, attention: bool) -> None:
    kernel = getattr(model.linear, "kernel", None)
    if kernel is not None:
        kernel.programmatic = products
    model.attend = functools.partial(model.attend.func, **{**model.attend.keywords, "programmatic": attention})


def forward_ms(model, timer: StepTimer, q: int) -> float:
    """GPU ms of one forward of q tokens a sequence (bass.kernels.timing.graph_us: its CUDA graph
    replayed REPLAYS times back to back, the median of SAMPLES such timings)."""
    runner = timer.runner
    chunks = runner.stage([(s, [7] * (q - 1)) for s in timer.states], [q] * len(timer.states))
    batch = RaggedBatch.build(chunks, runner.device)
    ms = graph_us(lambda: model.hidden(batch, runner.cache), replays=REPLAYS, rounds=SAMPLES) / 1000
    for s, chunk in zip(timer.states, chunks):
        runner.cache.truncate(s.slot, chunk.start)
    return ms


def main() -> None:
    report = {"device": torch.cuda.get_device_name(), "replays": REPLAYS, "rounds": ROUNDS, "samples": SAMPLES,
              "forwards": {}}
    roles = sys.argv[2].split(",") if len(sys.argv) > 2 else ["draft-fused"]
    qs = [int(q) for q in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1]
    settings = {k: SETTINGS[k] for k in os.environ.get("SETTINGS", ",".join(SETTINGS)).split(",")}
    for role in roles:
        shapes, int8, few_row_cuda, fuse = MODELS[role]
        model = random_transformer(shape_config(shapes), dtype="bfloat16", device="cuda", max_seq_len=600,
                                   attention="triton", int8_weights=int8, few_row_cuda=few_row_cuda, fuse_layers=fuse)
        for batch, q in [(b, q) for q in qs for b in (1, 8)]:
            timer = StepTimer(model, batch=batch, context=512, max_q=q, attention="triton", cuda_graphs=False,
                              device="cuda")
            times = {name: [] for name in settings}
            for _ in range(ROUNDS):
                for name, (products, attention) in settings.items():
                    set_programmatic(model, products, attention)
                    times[name].append(forward_ms(model, timer, q))
            entry = {name: {"median_ms": round(statistics.median(t), 4), "rounds_ms": [round(x, 4) for x in t]}
                     for name, t in times.items()}
            report["forwards"][f"{role}-{batch}" + (f"x{q}" if q > 1 else "")] = entry
            print(f"{role}, batch {batch}, {q} token(s) a sequence: " + ", ".join(f"{n} {e['median_ms']:.4f}" for n, e in entry.items())
                  + " ms a forward (GPU time, graph replays back to back)", flush=True)
            del timer
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
