"""The fused layer products for steps of 17-64 tokens (kernels/triton_layer_products.py) against
what those steps ran before: cuBLAS and the unfused layer's elementwise kernels.

1. `products`: each of the 1.5B target's four products with its layer epilogue, over a sweep of
   tilings, against cuBLAS's plain product (µs, CUDA-graph replays over enough distinct weights
   that they do not stay in L2).
2. `forwards`: whole forwards of random-weight models at the real pair's shapes (GPU time, graph
   replays back to back, as programmatic_launch.py): the layers fused up to 16 rows only (before)
   against fused up to 64 rows (the Triton products past 16), alternated on the same model.

On a GPU, PYTHONPATH with the bass build:
    python bench/gpu/kernels/layer_products.py OUT.json [PARTS] [ROWS]
PARTS: products,forwards (default both); ROWS: the products' rows, comma-separated (default 32,64).
TILINGS='{"2048x1536": [block_n, splits, block_k, warps, stages], ...}' sets the forwards' tilings.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from bass.app.bench.steps import StepTimer, random_transformer, shape_config
from bass.engine.fused_layers import pair_gate_up, pair_rope_heads
from bass.kernels.cuda_skinny import Rope
from bass.kernels.timing import graph_us
from bass.kernels.triton_layer_products import LayerProducts, Tiling, default_tiling
from programmatic_launch import forward_ms

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 1536, 8960, 12, 2, 128
PRODUCTS = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o": (HIDDEN, HIDDEN),
            "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
L2_BEATING_BYTES = 150e6
FORWARD_SHAPES = [(4, 4), (5, 4), (8, 3), (8, 4), (16, 4), (24, 1), (32, 1), (48, 1), (64, 1)]
ROUNDS = 3


def tilings_for(cols: int, inner: int) -> list[Tiling]:
    if cols >= 8192:  # gate|up: a tile each
        return [Tiling(block_n=bn, splits=s, block_k=bk, warps=w, stages=st)
                for bn in (64, 128) for s in (1, 2) for bk in (64, 128) for w in (4, 8) for st in (3, 4)
                if not (bn == 64 and s == 2)]
    out = []
    for bn in (64, 128):
        tiles = -(-cols // bn)
        for programs in (66, 132, 264):
            splits = max(1, round(programs / tiles))
            for w in (4, 8):
                out.append(Tiling(block_n=bn, splits=splits, block_k=64, warps=w, stages=3 if inner <= 2048 else 4))
    return list(dict.fromkeys(out))


def product_case(name: str, rows: int, dev):
    """(weights, call(w) -> launches the product with its epilogue, copies)."""
    cols, inner = PRODUCTS[name]
    copies = max(2, min(64, int(L2_BEATING_BYTES // (cols * inner * 2)) + 1))
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(rows, inner, device=dev, generator=gen).bfloat16()
    ws = [(torch.randn(cols, inner, device=dev, generator=gen) * 0.02).bfloat16() for _ in range(copies)]
    if name == "gate_up":
        ws = [pair_gate_up(w) for w in ws]
    if name == "qkv":
        ws = [pair_rope_heads(w, HEADS, KV_HEADS, HEAD_DIM) for w in ws]
    bias = torch.zeros(cols, device=dev, dtype=torch.bfloat16) if name == "qkv" else None
    q = torch.empty(rows, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    k = torch.zeros(rows, 600, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    cos = torch.ones(600, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    rope = Rope(cos, cos.clone(), torch.arange(rows, device=dev) + 500, torch.arange(rows, device=dev), q, k, v)
    stream = torch.randn(rows, cols, device=dev).bfloat16()
    kwargs = {"qkv": dict(norm_eps=1e-6, rope=rope), "o": dict(out=stream, residual=stream),
              "gate_up": dict(norm_eps=1e-6, silu_pairs=True), "down": dict(out=stream, residual=stream)}[name]
    return x, ws, bias, kwargs


def products_part(rows_list: list[int], dev) -> dict:
    lp = LayerProducts(dev, programmatic=False)
    report = {}
    for name, (cols, inner) in PRODUCTS.items():
        for rows in rows_list:
            x, ws, bias, kwargs = product_case(name, rows, dev)
            cublas = graph_us(lambda: [F.linear(x, w, bias) for w in ws], len(ws), replays=10, rounds=5)
            timed = []
            for t in tilings_for(cols, inner) + [default_tiling(cols, inner)]:
                try:
                    us = graph_us(lambda: [lp(x, w, bias, tiling=t, **kwargs) for w in ws], len(ws), replays=10,
                                  rounds=5)
                except Exception as exc:  # noqa: BLE001 - a tiling the compiler refuses
                    print(f"  {name} {rows} {t}: {type(exc).__name__} {str(exc)[:120]}", flush=True)
                    continue
                timed.append((us, t))
            timed.sort(key=lambda e: e[0])
            best_us, best = timed[0]
            default_us = next(us for us, t in timed if t == default_tiling(cols, inner))
            floor_us = cols * inner * 2 / 3.35e6
            report[f"{name}-{rows}"] = {"cublas_us": round(cublas, 2), "best_us": round(best_us, 2),
                                        "best": list(best.__dict__.values()), "default_us": round(default_us, 2),
                                        "read_floor_us_3.35TBs": round(floor_us, 2),
                                        "top5": [[round(us, 2), list(t.__dict__.values())] for us, t in timed[:5]]}
            print(f"{name} [{cols} x {inner}] {rows} rows: cuBLAS {cublas:.2f} µs, kernel best {best_us:.2f} "
                  f"({best}), default {default_us:.2f}, floor {floor_us:.2f}", flush=True)
    return report


def forwards_part(dev) -> dict:
    tilings = {tuple(int(n) for n in key.split("x")): Tiling(*v)
               for key, v in json.loads(os.environ.get("TILINGS", "{}")).items()}
    report = {}
    for role, shapes, int8 in (("target", "qwen2.5-coder-1.5b", False), ("draft", "qwen2.5-coder-0.5b", True)):
        model = random_transformer(shape_config(shapes), dtype="bfloat16", device="cuda", max_seq_len=600,
                                   attention="triton", int8_weights=int8, few_row_cuda=True, wide_fused=True)
        assert [most for most, _ in model.fused_products] == [16, 64], model.fused_products
        model.fused_products[1][1].tilings.update(tilings)
        wide = list(model.fused_products)
        for batch, q in FORWARD_SHAPES:
            if role == "draft" and batch * q > 32:
                continue
            timer = StepTimer(model, batch=batch, context=512, max_q=q, attention="triton", cuda_graphs=False,
                              device="cuda")
            times = {"unfused": [], "fused": []}
            for _ in range(ROUNDS):
                for name, products in (("unfused", wide[:1]), ("fused", wide)):
                    model.fused_products = products
                    times[name].append(forward_ms(model, timer, q))
            model.fused_products = wide
            entry = {n: round(statistics.median(t), 4) for n, t in times.items()}
            report[f"{role}-{batch}x{q}"] = entry
            print(f"{role}, {batch} x {q} = {batch * q} rows: past 16 rows unfused {entry['unfused']:.4f}, "
                  f"fused {entry['fused']:.4f} ms a forward (GPU time)", flush=True)
            del timer
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    return report


def main() -> None:
    dev = torch.device("cuda")
    parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["products", "forwards"]
    rows = [int(r) for r in sys.argv[3].split(",")] if len(sys.argv) > 3 else [32, 64]
    report = {"device": torch.cuda.get_device_name()}
    if "products" in parts:
        report["products"] = products_part(rows, dev)
    if "forwards" in parts:
        report["forwards"] = forwards_part(dev)
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
