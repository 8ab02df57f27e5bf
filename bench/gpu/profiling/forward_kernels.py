"""Where a forward spends its GPU time, kernel by kernel: the int8 0.5B draft and the bf16 1.5B
target at random weights, one token a sequence, 512-token contexts. Eager forwards under the
torch profiler give each kernel's duration on the GPU; the same forward's wall time under CUDA
graphs, minus their sum, is what the boundaries between kernels cost.

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/profiling/forward_kernels.py OUT.json [ROLE,...] [SHAPE,...]
ROLE: draft (int8, unfused), draft-fused (int8 with the CUDA few-row kernel: the served draft's
five-launch layers), target (bf16, cuBLAS), target-fused (bf16 with the few-row kernel: the served
target); draft, draft-fused and target by default. SHAPE: SEQSxTOKENS, sequences and query tokens
each (8x4: a k = 3 verification of 8 sequences, 32 rows); 1x1,8x1 by default.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from bass.app.bench.steps import StepTimer, random_transformer, shape_config


def kernel_table(timer: StepTimer, forwards: int, tokens: int) -> list[dict]:
    runner, states = timer.runner, timer.states
    lengths = [runner.cache.length(s.slot) for s in states]

    def once():
        runner.forward([(s, [7] * (tokens - 1)) for s in states], [tokens] * len(states))
        for s, n in zip(states, lengths):
            runner.cache.truncate(s.slot, n)

    for _ in range(3):
        once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            once()
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            counts[event.name[:90]] += 1
    rows = [{"kernel": k, "us_per_forward": round(v / forwards, 2), "calls_per_forward": counts[k] / forwards,
             "us_per_call": round(v / counts[k], 2)} for k, v in totals.items()]
    return sorted(rows, key=lambda r: -r["us_per_forward"])


MODELS = {"draft": ("qwen2.5-coder-0.5b", True, False), "draft-fused": ("qwen2.5-coder-0.5b", True, True),
          "target": ("qwen2.5-coder-1.5b", False, False),
          "target-fused": ("qwen2.5-coder-1.5b", False, True)}  # (shapes, int8, few-row CUDA kernel)
DEFAULT_ROLES = ("draft", "draft-fused", "target")


def main() -> None:
    report = {"device": torch.cuda.get_device_name(), "forwards": {}}
    roles = sys.argv[2].split(",") if len(sys.argv) > 2 else list(DEFAULT_ROLES)
    shapes_arg = sys.argv[3] if len(sys.argv) > 3 else "1x1,8x1"
    steps = [tuple(int(v) for v in shape.split("x")) for shape in shapes_arg.split(",")]
    for role in roles:
        shapes, int8, few_row_cuda = MODELS[role]
        model = random_transformer(shape_config(shapes), dtype="bfloat16", device="cuda", max_seq_len=600,
                                   attention="triton", int8_weights=int8, few_row_cuda=few_row_cuda)
        for batch, tokens in steps:
            eager = StepTimer(model, batch=batch, context=512, max_q=tokens, attention="triton", cuda_graphs=False,
                              device="cuda")
            table = kernel_table(eager, 20, tokens)
            graphed = StepTimer(model, batch=batch, context=512, max_q=tokens, attention="triton", cuda_graphs=True,
                                device="cuda")
            entry = {"graph_ms": round(graphed.time_forward(tokens, 200).median_ms, 4),
                     "eager_ms": round(eager.time_forward(tokens, 50).median_ms, 4),
                     "kernel_us_sum": round(sum(r["us_per_forward"] for r in table), 1),
                     "kernels_per_forward": sum(r["calls_per_forward"] for r in table), "kernels": table}
            report["forwards"][f"{role}-{batch}x{tokens}"] = entry
            print(f"{role}, {batch} x {tokens} tokens: graph {entry['graph_ms']} ms, eager {entry['eager_ms']} ms, "
                  f"kernels {entry['kernels_per_forward']:.0f} summing {entry['kernel_us_sum']} us", flush=True)
            for r in table[:14]:
                print(f"   {r['us_per_forward']:8.1f} us {r['calls_per_forward']:5.0f}x {r['us_per_call']:6.2f}  {r['kernel']}",
                      flush=True)
            del eager, graphed
            torch.cuda.empty_cache()
        del model
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
