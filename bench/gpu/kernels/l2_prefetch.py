"""What pulling a layer's later weights into L2 saves a fused forward, on the GPU alone
(Transformer.set_l2_prefetch, kernels/cuda/skinny_gemm.cu's PrefetchArgs).

At 1-16 rows a decoder layer's attention and small products leave the memory bus mostly idle,
and its wide products (the 1.5B target's gate|up: 55 MB, down: 27.5 MB) then stream from DRAM
alone. Here each layer's q|k|v product (or its o product) asks for the first BUDGET bytes of the
layer's o, gate|up and down weights to be prefetched into L2, and the forward is timed as
programmatic_launch.py times it: captured in a CUDA graph and replayed back to back (GPU time
only), random weights at the served shapes, 512-token contexts, settings alternated ROUNDS times
on the same model. Every setting's hidden rows are checked equal, bit for bit, to those without
a prefetch (a prefetch is a hint: it may change speed, never values).

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kernels/l2_prefetch.py OUT.json [ROLE,...] [BxQ,...]
ROLE: target-cuda (default; the bf16 1.5B's fused layers), draft-fused (the int8 0.5B's).
BxQ: sequences x tokens a sequence (default 1x1,8x1,1x4,2x4,4x4: decode and k = 3 verifications,
all <= 16 rows, the fused layers' range). SETTINGS (env): comma-separated NAME=MB[:CARRIER[:start]]
(default below); MB 0 is the baseline.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from bass.app.bench.steps import StepTimer, random_transformer, shape_config
from bass.kernels.batch import RaggedBatch
from bass.kernels.timing import graph_us

MODELS = {"target-cuda": ("qwen2.5-coder-1.5b", False), "draft-fused": ("qwen2.5-coder-0.5b", True)}
DEFAULT_SETTINGS = {
    "target-cuda": "off=0,q8=8,q16=16,q24=24,q32=32,q48=48,q24s=24:qkv:start,o24s=24:o:start",
    "draft-fused": "off=0,q4=4,q8=8,q16=16,q16s=16:qkv:start,o16s=16:o:start",
}
REPLAYS, ROUNDS, SAMPLES = 20, 4, 15


def parse_settings(text: str) -> dict[str, tuple[int, str, bool]]:
    settings = {}
    for item in text.split(","):
        name, spec = item.split("=")
        parts = spec.split(":")
        settings[name] = (int(float(parts[0]) * (1 << 20)), parts[1] if len(parts) > 1 else "qkv",
                          len(parts) > 2 and parts[2] == "start")
    return settings


def staged(timer: StepTimer, q: int) -> tuple[RaggedBatch, list]:
    runner = timer.runner
    chunks = runner.stage([(s, [7] * (q - 1)) for s in timer.states], [q] * len(timer.states))
    return RaggedBatch.build(chunks, runner.device), chunks


def unstage(timer: StepTimer, chunks: list) -> None:
    for s, chunk in zip(timer.states, chunks):
        timer.runner.cache.truncate(s.slot, chunk.start)


def forward_ms(model, timer: StepTimer, q: int) -> float:
    batch, chunks = staged(timer, q)
    ms = graph_us(lambda: model.hidden(batch, timer.runner.cache), replays=REPLAYS, rounds=SAMPLES) / 1000
    unstage(timer, chunks)
    return ms


def hidden_rows(model, timer: StepTimer, q: int) -> torch.Tensor:
    batch, chunks = staged(timer, q)
    out = model.hidden(batch, timer.runner.cache).clone()
    torch.cuda.synchronize()
    unstage(timer, chunks)
    return out


def main() -> None:
    roles = sys.argv[2].split(",") if len(sys.argv) > 2 else ["target-cuda"]
    cases = [tuple(int(v) for v in c.split("x")) for c in (sys.argv[3] if len(sys.argv) > 3
                                                             else "1x1,8x1,1x4,2x4,4x4").split(",")]
    report = {"device": torch.cuda.get_device_name(), "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
              "replays": REPLAYS, "rounds": ROUNDS, "samples": SAMPLES, "forwards": {}}
    for role in roles:
        shapes, int8 = MODELS[role]
        settings = parse_settings(os.environ.get("SETTINGS", DEFAULT_SETTINGS[role]))
        model = random_transformer(shape_config(shapes), dtype="bfloat16", device="cuda", max_seq_len=600,
                                   attention="triton", int8_weights=int8, few_row_cuda=True, fuse_layers=True)
        assert model.fused_layers, "the fused layers did not load (no few-row CUDA kernel?)"
        for batch, q in cases:
            timer = StepTimer(model, batch=batch, context=512, max_q=q, attention="triton", cuda_graphs=False,
                              device="cuda")
            model.set_l2_prefetch(0)
            reference = hidden_rows(model, timer, q)
            equal = {}
            for name, (budget, carrier, at_start) in settings.items():
                model.set_l2_prefetch(budget, carrier, at_start)
                equal[name] = bool(torch.equal(hidden_rows(model, timer, q), reference))
            times = {name: [] for name in settings}
            for _ in range(ROUNDS):
                for name, (budget, carrier, at_start) in settings.items():
                    model.set_l2_prefetch(budget, carrier, at_start)
                    times[name].append(forward_ms(model, timer, q))
            entry = {name: {"median_ms": round(statistics.median(t), 4), "rounds_ms": [round(x, 4) for x in t],
                            "equal_to_off": equal[name]} for name, t in times.items()}
            report["forwards"][f"{role}-{batch}x{q}"] = entry
            base = entry[next(iter(entry))]["median_ms"]
            print(f"{role}, {batch} x {q}: " + ", ".join(
                f"{n} {e['median_ms']:.4f} ({e['median_ms'] / base:.3f}{'' if e['equal_to_off'] else ' VALUES DIFFER'})"
                for n, e in entry.items()) + " ms a forward", flush=True)
            del timer
            torch.cuda.empty_cache()
        model.set_l2_prefetch(0)
        del model
        torch.cuda.empty_cache()
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
