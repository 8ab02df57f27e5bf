"""The CUDA few-row products (kernels/cuda/skinny_gemm.cu) against what the models run today: the
draft's int8 products (kernels/triton_int8.py) and the target's bf16 products (cuBLAS), at the
real pair's shapes.

Timings are CUDA-graph replays (graph_timing.py) over enough distinct weights that they do not
stay in L2 (>= 150 MB a graph): per projection (with a sweep of launch shapes), and all products
of a forward in layer order ("forward"), which is what a decode step pays. Correctness: each
result against fp32 x @ w.T of the same (dequantized) weights.

On a GPU, PYTHONPATH with the bass build:
    python bench/gpu/kernels/skinny_gemm.py OUT.json [--quick]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bass.kernels.cuda_skinny import Launch, SplitScratch, launch_for, load_skinny_gemm, row_groups_for
from bass.kernels.triton_int8 import Int8Linear, Int8Weight
from graph_timing import graph_us

# (output columns, inner) per projection
DRAFT = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864), "lm_head": (151936, 896)}
TARGET = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960),
          "lm_head": (151936, 1536)}
DRAFT_LAYERS, TARGET_LAYERS = 24, 28
L2_BEATING_BYTES = 150e6


def copies_for(cols: int, inner: int, bytes_per: int) -> int:
    return max(2, min(256, int(L2_BEATING_BYTES // (cols * inner * bytes_per)) + 1))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6))


def sweep_launches(rows: int, cols: int, split: SplitScratch) -> list[Launch]:
    launches = [Launch(row_groups_for(rows), g, w, b) for g in (1, 2) for w in (2, 4, 8, 16) for b in (0, 2)]
    launches += [Launch(row_groups_for(rows), g, w, 0, s) for g in (1, 2) for w in (4, 8, 16) for s in (2, 4)
                 if cols <= 4096]
    return [launch for launch in launches if launch.fits() and (launch.k_splits == 1 or split.holds(launch, cols))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true", help="no sweep of launch shapes")
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--only", default="", help="comma-separated model:projection pairs (e.g. target-bf16:down)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    skinny = load_skinny_gemm(dev)
    assert skinny is not None, "the CUDA kernel did not build"
    int8_linear = Int8Linear(dev)
    split = SplitScratch(dev)
    gen = torch.Generator(device="cuda").manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "projections": [], "forward": []}

    for model, shapes, int8 in (("draft-int8", DRAFT, True), ("target-bf16", TARGET, False)):
        for name, (cols, inner) in shapes.items():
            if args.only and f"{model}:{name}" not in args.only.split(","):
                continue
            n = copies_for(cols, inner, 1 if int8 else 2)
            full = [(torch.randn(cols, inner, device=dev, generator=gen) * 0.02).bfloat16() for _ in range(n)]
            ws = [Int8Weight.quantize(w) for w in full] if int8 else full
            if int8:
                del full
            for rows in [r for r in ((1, 8, 16) if int8 else (1, 8, 16, 32, 64)) if r <= args.max_rows]:
                x = torch.randn(rows, inner, device=dev, generator=gen).bfloat16()
                out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
                out = torch.empty(rows, cols, device=dev, dtype=out_dtype)
                if int8:
                    ref = x.float() @ ws[0].dequantized().T
                    today = lambda: [int8_linear(x, w, None, out_dtype) for w in ws]  # noqa: E731
                    run = lambda launch=None: [skinny(x, w.q, w.scale, None, out, launch, split) for w in ws]  # noqa: E731
                    skinny(x, ws[0].q, ws[0].scale, None, out)
                else:
                    ref = x.float() @ ws[0].float().T
                    today = lambda: [F.linear(x, w) for w in ws]  # noqa: E731
                    run = lambda launch=None: [skinny(x, w, None, None, out, launch, split) for w in ws]  # noqa: E731
                    skinny(x, ws[0], None, None, out)
                err = rel_err(out, ref)
                today_err = rel_err(today()[0], ref) if int8 else rel_err(F.linear(x, ws[0]), ref)
                default = launch_for(rows, cols, inner, int8)
                row = {"model": model, "projection": name, "rows": rows, "copies": n,
                       "today_us": round(graph_us(today, n), 3), "skinny_us": round(graph_us(run, n), 3),
                       "launch": default.__dict__, "rel_err": err, "today_rel_err": today_err}
                if not args.quick:
                    best = min(((graph_us(lambda: run(launch), n), launch) for launch in sweep_launches(rows, cols, split)),
                               key=lambda t: t[0])
                    row["best_us"], row["best_launch"] = round(best[0], 3), best[1].__dict__
                report["projections"].append(row)
                print(json.dumps(row), flush=True)
            ws = full = []  # free them before the next projection
            torch.cuda.empty_cache()

    # A forward's products in layer order (no attention or glue): what the step pays for them.
    for model, shapes, int8, layers in (("draft-int8", DRAFT, True, DRAFT_LAYERS),
                                        ("target-bf16", TARGET, False, TARGET_LAYERS)):
        per_layer = [n for n in shapes if n != "lm_head"]
        full = {n: [(torch.randn(*shapes[n], device=dev, generator=gen) * 0.02).bfloat16() for _ in range(layers)]
                for n in per_layer}
        full["lm_head"] = [(torch.randn(*shapes["lm_head"], device=dev, generator=gen) * 0.02).bfloat16()]
        ws = {n: [Int8Weight.quantize(w) for w in v] for n, v in full.items()} if int8 else full
        for rows in [r for r in ((1, 8, 16) if int8 else (1, 8, 16, 32, 64)) if r <= args.max_rows]:
            xs = {n: torch.randn(rows, shapes[n][1], device=dev, generator=gen).bfloat16() for n in shapes}
            outs = {n: torch.empty(rows, shapes[n][0], device=dev,
                                   dtype=torch.float32 if n == "lm_head" else torch.bfloat16) for n in shapes}

            def today():
                for i in range(layers):
                    for n in per_layer:
                        (int8_linear(xs[n], ws[n][i]) if int8 else F.linear(xs[n], ws[n][i]))
                (int8_linear(xs["lm_head"], ws["lm_head"][0], None, torch.float32) if int8
                 else F.linear(xs["lm_head"], ws["lm_head"][0]).float())

            def new():
                for i in range(layers):
                    for n in per_layer:
                        w = ws[n][i]
                        skinny(xs[n], w.q if int8 else w, w.scale if int8 else None, None, outs[n])
                w = ws["lm_head"][0]
                skinny(xs["lm_head"], w.q if int8 else w, w.scale if int8 else None, None, outs["lm_head"])

            bytes_moved = sum(w.q.numel() + 4 * w.scale.numel() if int8 else 2 * w.numel()
                              for v in ws.values() for w in v)
            row = {"model": model, "rows": rows, "weight_mb": round(bytes_moved / 1e6, 1),
                   "today_us": round(graph_us(today), 1), "skinny_us": round(graph_us(new), 1)}
            report["forward"].append(row)
            print(json.dumps(row), flush=True)
        ws = full = {}  # free them before the next model
        torch.cuda.empty_cache()
    json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
