"""What the batch-invariant linear layer costs against cuBLAS, per tiling, at the real shapes (issue #15).

For every weight shape of the Qwen2.5-Coder 1.5B target (and the LM head) and a set of row
counts (decode, verify at k = 4, prefill chunks), times F.linear and the invariant Triton kernel
under each candidate tiling, each as a CUDA graph of back-to-back calls (so Python launch cost
is out), and checks that the tiling keeps rows bitwise equal between a batch of 1/8/40 and the
full batch. Prints a JSON summary: per tiling, the time of one forward's GEMMs (28 layers + LM
head) at each row count, against cuBLAS.

A tiling may depend on the weight's shape but never on the number of rows, so the choice is made
per weight shape from these numbers (kernels/triton_matmul.py).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bass.app.bench.environment import describe
from bass.kernels.triton_matmul import launch_linear, splits_for, tiling_for

TARGET = {"qkv": (2048, 1536, True), "o": (1536, 1536, False), "gate_up": (17920, 1536, False),
          "down": (1536, 8960, False), "lm_head": (151936, 1536, False)}
LAYERS = 28
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, K splits); "chosen" is kernels/triton_matmul's pick per shape
# and rows. Only tilings of one split count are bitwise alike (the invariance check below runs
# each tiling against itself at other row counts).
TILINGS = [(64, 32, 64, 4, 4, 1), (64, 128, 64, 4, 3, 1), (16, 32, 128, 4, 4, 1), (16, 64, 64, 4, 4, 1),
           (64, 32, 64, 4, 4, 2), (64, 32, 64, 4, 4, 4), (64, 32, 64, 4, 4, 8), (16, 32, 128, 4, 4, 2),
           (16, 32, 128, 4, 4, 4), (16, 32, 128, 4, 4, 8), (64, 64, 64, 4, 3, 2), (64, 64, 64, 4, 3, 4),
           (64, 128, 64, 4, 3, 2), (16, 64, 128, 4, 4, 2), (128, 64, 64, 8, 3, 1), (64, 64, 64, 4, 4, 1),
           (128, 128, 64, 8, 3, 1), (128, 64, 64, 8, 3, 4), (128, 128, 64, 8, 3, 4), (64, 128, 64, 4, 3, 4),
           (32, 64, 128, 4, 4, 1), (32, 64, 128, 4, 4, 4)]
ARRIVALS: list = []


def launch(x, w, bias, out, tiling):
    if not ARRIVALS:
        ARRIVALS.append(torch.zeros(1 << 16, dtype=torch.int32, device="cuda"))
    if tiling == "chosen":
        launch_linear(x, w, bias, out, ARRIVALS[0], tiling_for(*x.shape[:1], w.shape[0], x.shape[1]),
                      splits_for(x.shape[1]))
    else:
        launch_linear(x, w, bias, out, ARRIVALS[0], tiling[:5], tiling[5])
    return out


def graph_time_us(fn, calls: int = 20, repeats: int = 7) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,40,320,2048")
    ap.add_argument("--only", help="comma-separated tilings' indexes in TILINGS to time (default: all)")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    tilings = ["chosen"] + ([TILINGS[int(i)] for i in args.only.split(",")] if args.only else TILINGS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    results: dict = {"env": describe("cuda"), "shapes": {}, "forward_us": {}}
    per_forward = {"cublas": {r: 0.0 for r in rows_list}} | {str(t): {r: 0.0 for r in rows_list} for t in tilings}
    invariant = {str(t): True for t in tilings}
    for name, (cols, inner, has_bias) in TARGET.items():
        weight = (torch.randn(cols, inner, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        bias = (torch.randn(cols, device="cuda", generator=gen) * 0.02).to(torch.bfloat16) if has_bias else None
        big = torch.randn(max(rows_list), inner, device="cuda", generator=gen).to(torch.bfloat16)
        count = 1 if name == "lm_head" else LAYERS
        shape_rows: dict = {}
        for rows in rows_list:
            if name == "lm_head" and rows > 512:  # logits are asked of a few rows a sequence
                continue
            x = big[:rows].contiguous()
            out = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
            row_times = {"cublas": graph_time_us(lambda: F.linear(x, weight, bias))}
            for tiling in tilings:
                try:
                    row_times[str(tiling)] = graph_time_us(lambda: launch(x, weight, bias, out, tiling))
                except Exception as exc:  # a tiling the compiler rejects is reported, not fatal
                    row_times[str(tiling)] = None
                    print(f"{name} rows={rows} {tiling}: {type(exc).__name__}: {str(exc)[:200]}")
            for key, value in row_times.items():
                if value is not None:
                    per_forward[key][rows] += count * value
                else:
                    per_forward[key][rows] = float("nan")
            shape_rows[rows] = row_times
        for tiling in tilings:
            n = max(rows_list) if name != "lm_head" else 320
            full = torch.empty(n, cols, device="cuda", dtype=torch.bfloat16)
            try:
                launch(big[:n].contiguous(), weight, bias, full, tiling)
                for part in (1, 8, 40):
                    sub = torch.empty(part, cols, device="cuda", dtype=torch.bfloat16)
                    launch(big[:part].contiguous(), weight, bias, sub, tiling)
                    invariant[str(tiling)] &= bool(torch.equal(sub, full[:part]))
            except Exception:
                invariant[str(tiling)] = False
        results["shapes"][name] = shape_rows
        print(name, {r: {k: (round(v, 1) if v else v) for k, v in t.items()} for r, t in shape_rows.items()}, flush=True)
    results["forward_us"] = per_forward
    results["rows_bitwise_invariant"] = invariant
    print("one 1.5B forward's GEMMs (us):")
    for key, by_rows in per_forward.items():
        print(f"  {key:28s} " + " ".join(f"{r}:{v:8.0f}" for r, v in by_rows.items())
              + ("" if key == "cublas" else f"  invariant={invariant[key]}"))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
