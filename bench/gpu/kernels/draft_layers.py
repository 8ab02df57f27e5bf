"""The int8 draft's forward with the fused layers (kernels/triton_draft_layer.py: seven launches a
layer) against the unfused path (nine), and the fused kernels' tilings: random weights at the
0.5B draft's shapes, 512-token contexts, CUDA graphs, `bass bench steps`' timer (median of
per-forward CUDA events). The two paths alternate, 3 rounds, so drift shows.

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kernels/draft_layers.py OUT.json [--tilings]
"""

from __future__ import annotations

import argparse
import json

import torch

import bass.kernels.triton_draft_layer as fused
from bass.app.bench.steps import StepTimer, random_transformer, shape_config

BATCHES = (1, 8, 16)
QKV_TILINGS = [(16, 128, 4, 4), (32, 128, 4, 3), (32, 256, 4, 2), (16, 512, 4, 1)]
GATE_UP_TILINGS = [(32, 128, 4, 4), (32, 64, 4, 4), (64, 128, 4, 3), (16, 256, 4, 2)]


def time_forward(model, batch: int, q: int, repeats: int) -> float:
    timer = StepTimer(model, batch=batch, context=512, max_q=q, attention="triton", cuda_graphs=True, device="cuda")
    ms = timer.time_forward(q, repeats).median_ms
    del timer
    torch.cuda.empty_cache()
    return round(ms, 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tilings", action="store_true", help="also sweep the fused kernels' tilings at 8 rows")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    model = random_transformer(shape_config("qwen2.5-coder-0.5b"), dtype="bfloat16", device="cuda",
                               max_seq_len=600, attention="triton", int8_weights=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "forward_ms": [], "tilings": []}
    for round_ in range(3):
        for batch in BATCHES:
            for q in (1, 4):  # a draft token; a step's first forward (the accepted tokens + 1), batch * 4 <= 16
                if batch * q > 16:
                    continue
                row = {"round": round_, "batch": batch, "tokens_per_seq": q}
                for on in (False, True) if round_ % 2 == 0 else (True, False):
                    model.fused_draft_layers = on
                    row["fused_ms" if on else "unfused_ms"] = time_forward(model, batch, q, args.repeats)
                row["speedup"] = round(row["unfused_ms"] / row["fused_ms"], 3)
                report["forward_ms"].append(row)
                print(json.dumps(row), flush=True)
    if args.tilings:
        model.fused_draft_layers = True
        base_qkv, base_gu = fused.QKV_TILING, fused.GATE_UP_TILING
        for qkv in QKV_TILINGS:
            for gu in GATE_UP_TILINGS:
                fused.QKV_TILING, fused.GATE_UP_TILING = qkv, gu
                row = {"qkv": qkv, "gate_up": gu, "ms_at_8": time_forward(model, 8, 1, args.repeats)}
                report["tilings"].append(row)
                print(json.dumps(row), flush=True)
        fused.QKV_TILING, fused.GATE_UP_TILING = base_qkv, base_gu
    json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
