"""One decoder layer's projections, fused (kernels/triton_fused_linear.py) against unfused
(cuBLAS + the fused elementwise kernels), at the real shapes, per tile candidate (issue #12).

For the Qwen2.5-Coder 1.5B target and 0.5B draft and a set of row counts, times each
projection group as the unfused path runs it and as the fused kernel runs it under every
candidate tile, each call with L2 flushed first (in a real forward the layers before evicted
this layer's weights): a CUDA graph of 20 x (flush, call) minus one of 20 flushes. Prints and
writes per group the µs, the weight-bytes floor at the device's bandwidth, and one layer's sum.

Unfused groups, as engine/model.py runs them: qkv = add + RMSNorm, GEMM + bias, RoPE + KV
write; o = GEMM; gate_up = add + RMSNorm, GEMM, SiLU * up; down = GEMM.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bass.bench.environment import describe
from bass.kernels.triton_elementwise import add_rms_norm, rope_into_cache, silu_mul
from bass.kernels.triton_fused_linear import FusedLinears

_RESIDUAL, _SILU_MUL, _ROPE_CACHE = 1, 2, 3  # kernels/triton_fused_linear's epilogue codes

# hidden, intermediate, heads, kv_heads, head_dim
SHAPES = {"1.5b": (1536, 8960, 12, 2, 128), "0.5b": (896, 4864, 14, 2, 64)}


def graph_us(fn, flush, calls: int = 20, repeats: int = 5) -> float:
    def timed(body) -> float:
        for _ in range(2):
            body()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                body()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000 / calls)
        return sorted(times)[len(times) // 2]

    return timed(lambda: (flush.sum(), fn())) - timed(flush.sum)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--bandwidth-gbs", type=float, default=3350.0, help="HBM bandwidth for the floor (H100 SXM)")
    ap.add_argument("--wide", action="store_true",
                    help="Instead: the 1.5B's projections at 1 and 8 rows over a wide tile grid (warps, stages, "
                         "BLOCK_K up to 512), gate_up with and without its norm, and cuBLAS's GEMM alone.")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.wide:
        return wide(args)
    dev, dt = torch.device("cuda"), torch.bfloat16
    flush = torch.ones(16 << 20, dtype=torch.float32, device=dev)  # 64 MB, read between calls
    results: dict = {"env": describe("cuda"), "bandwidth_gbs": args.bandwidth_gbs, "shapes": {}}
    for name, (hidden, inter, heads, kv_heads, dim) in SHAPES.items():
        gen = torch.Generator(device=dev).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=gen, device=dev) * 0.02).to(dt)

        qkv_w, qkv_b, o_w = w((heads + 2 * kv_heads) * dim, hidden), w((heads + 2 * kv_heads) * dim), w(hidden, heads * dim)
        gu_w, down_w, norm = w(2 * inter, hidden), w(hidden, inter), torch.ones(hidden, dtype=dt, device=dev)
        k_cache = torch.zeros(4, 1024, kv_heads, dim, dtype=dt, device=dev)
        v_cache = torch.zeros_like(k_cache)
        floor_bytes = {"qkv": qkv_w.numel() * 2, "o": o_w.numel() * 2, "gate_up": gu_w.numel() * 2,
                       "down": down_w.numel() * 2}
        for rows in [int(r) for r in args.rows.split(",")]:
            x, res = w(rows, hidden) * 50, w(rows, hidden) * 50
            attn, act = w(rows, heads * dim) * 50, w(rows, inter) * 50
            cos, sin = torch.ones(rows, dim, dtype=dt, device=dev), torch.zeros(rows, dim, dtype=dt, device=dev)
            slots = torch.arange(rows, device=dev) % 4
            pos = torch.arange(rows, device=dev) // 4
            unfused = {
                "qkv": lambda: rope_into_cache(F.linear(add_rms_norm(x, res, norm, 1e-6)[0], qkv_w, qkv_b), cos, sin,
                                               k_cache, v_cache, slots, pos, heads, kv_heads),
                "o": lambda: F.linear(attn, o_w),
                "gate_up": lambda: silu_mul(F.linear(add_rms_norm(x, res, norm, 1e-6)[0], gu_w)),
                "down": lambda: F.linear(act, down_w),
            }
            fused = FusedLinears(dev)
            q_out = torch.empty(rows, heads, dim, dtype=dt, device=dev)
            o_out, gu_out = torch.empty(rows, hidden, dtype=dt, device=dev), torch.empty(rows, inter, dtype=dt, device=dev)
            rope = (cos, sin, k_cache, v_cache, slots, pos, heads, kv_heads, dim // 2)
            groups = {
                "qkv": (_ROPE_CACHE, heads * dim, hidden, lambda t: fused._run(t, x, qkv_w, qkv_b, norm, 1e-6, None, q_out,
                                                                              _ROPE_CACHE, heads * dim, rope)),
                "o": (_RESIDUAL, hidden, heads * dim, lambda t: fused._run(t, attn, o_w, None, None, 0.0, res, o_out,
                                                                          _RESIDUAL, hidden, None)),
                "gate_up": (_SILU_MUL, inter, hidden, lambda t: fused._run(t, x, gu_w, None, norm, 1e-6, None, gu_out,
                                                                          _SILU_MUL, inter, None)),
                "down": (_RESIDUAL, hidden, inter, lambda t: fused._run(t, act, down_w, None, None, 0.0, res, o_out,
                                                                       _RESIDUAL, hidden, None)),
            }
            row: dict = {}
            layer = {"unfused": 0.0, "fused_best": 0.0, "floor": 0.0}
            for group, (epilogue, n, k, run) in groups.items():
                base = graph_us(unfused[group], flush)
                tiles = {}
                for t in fused.candidates(epilogue, n, k, dim // 2, heads + 2 * kv_heads):
                    try:
                        tiles[f"m{t.block_m}n{t.block_n}k{t.block_k}s{t.split_k}"] = round(
                            graph_us(lambda t=t: run(t), flush), 2)
                    except Exception as exc:  # a tile the compiler rejects is reported, not fatal
                        tiles[str(t)] = f"{type(exc).__name__}: {str(exc)[:120]}"
                timed_tiles = {key: v for key, v in tiles.items() if isinstance(v, float)}
                if not timed_tiles:
                    print(group, tiles, flush=True)
                    continue
                best = min(timed_tiles, key=timed_tiles.get)
                floor = floor_bytes[group] / (args.bandwidth_gbs * 1e3)
                row[group] = {"unfused_us": round(base, 2), "floor_us": round(floor, 2), "best": best,
                              "best_us": timed_tiles[best], "tiles": tiles}
                layer["unfused"] += base
                layer["fused_best"] += timed_tiles[best]
                layer["floor"] += floor
                print(f"{name} rows={rows:3d} {group:8s} unfused {base:7.2f}  fused {timed_tiles[best]:7.2f} ({best})"
                      f"  floor {floor:6.2f}", flush=True)
            row["layer_us"] = {key: round(v, 2) for key, v in layer.items()}
            print(f"{name} rows={rows:3d} one layer: " + ", ".join(f"{key} {v:.1f}" for key, v in layer.items()),
                  flush=True)
            results["shapes"].setdefault(name, {})[rows] = row
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


def wide(args) -> None:
    from bass.kernels.triton_fused_linear import Tiling

    dev, dt = torch.device("cuda"), torch.bfloat16
    flush = torch.ones(16 << 20, dtype=torch.float32, device=dev)
    hidden, inter, heads, kv_heads, dim = SHAPES["1.5b"]
    gen = torch.Generator(device=dev).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=dev) * 0.02).to(dt)

    qkv_w, qkv_b = w((heads + 2 * kv_heads) * dim, hidden), w((heads + 2 * kv_heads) * dim)
    gu_w, down_w, norm = w(2 * inter, hidden), w(hidden, inter), torch.ones(hidden, dtype=dt, device=dev)
    k_cache = torch.zeros(4, 1024, kv_heads, dim, dtype=dt, device=dev)
    v_cache = torch.zeros_like(k_cache)
    out: dict = {"env": describe("cuda"), "results": []}
    fused = FusedLinears(dev)
    for rows in (1, 8):
        x, act, res = w(rows, hidden) * 50, w(rows, inter) * 50, w(rows, hidden) * 50
        cos, sin = torch.ones(rows, dim, dtype=dt, device=dev), torch.zeros(rows, dim, dtype=dt, device=dev)
        slots, pos = torch.arange(rows, device=dev) % 4, torch.arange(rows, device=dev) // 4
        q_out = torch.empty(rows, heads, dim, dtype=dt, device=dev)
        gu_out, o_out = torch.empty(rows, inter, dtype=dt, device=dev), torch.empty(rows, hidden, dtype=dt, device=dev)
        rope = (cos, sin, k_cache, v_cache, slots, pos, heads, kv_heads, dim // 2)
        cublas = {"qkv": lambda: F.linear(x, qkv_w, qkv_b), "gate_up": lambda: F.linear(x, gu_w),
                  "down": lambda: F.linear(act, down_w)}
        for name, fn in cublas.items():
            us = graph_us(fn, flush)
            print(f"rows={rows} {name} cuBLAS GEMM alone {us:.2f}", flush=True)
            out["results"].append({"rows": rows, "group": name, "kernel": "cublas", "us": round(us, 2)})
        groups = {
            "qkv": lambda t: fused._run(t, x, qkv_w, qkv_b, norm, 1e-6, None, q_out, 3, heads * dim, rope),
            "gate_up": lambda t: fused._run(t, x, gu_w, None, norm, 1e-6, None, gu_out, 2, inter, None),
            "gate_up-no-norm": lambda t: fused._run(t, x, gu_w, None, None, 0.0, None, gu_out, 2, inter, None),
            "down": lambda t: fused._run(t, act, down_w, None, None, 0.0, res, o_out, 1, hidden, None),
        }
        for name, run in groups.items():
            k = inter if name == "down" else hidden
            timings = []
            for block_n in (16, 32, 64):
                for block_k in (128, 256, 512):
                    if name == "qkv" and block_n > 64:
                        continue
                    for warps, stages in ((4, 3), (4, 5), (8, 3), (8, 5)):
                        split = 1
                        if name == "down":
                            while (hidden // block_n) * split < 132 and 2 * split <= k // block_k:
                                split *= 2
                        t = Tiling(16, block_n, block_k, split, warps, stages)
                        try:
                            us = graph_us(lambda: run(t), flush)
                        except Exception as exc:
                            print(f"rows={rows} {name} {t}: {type(exc).__name__} {str(exc)[:100]}", flush=True)
                            continue
                        timings.append((us, t))
                        out["results"].append({"rows": rows, "group": name, "kernel": str(t), "us": round(us, 2)})
            timings.sort(key=lambda p: p[0])
            print(f"rows={rows} {name} best: " + "; ".join(f"{us:.2f} {t}" for us, t in timings[:4]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
