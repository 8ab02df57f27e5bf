"""The draft's fused few-row kernels (kernels/triton_skinny.py) against what they replace, on a GPU.

No models needed: random weights at the 0.5B draft's shapes.
Part 1, per projection of a layer (q|k|v with its norm, o, gate|up with its norm and SiLU, down):
  24 calls over 24 layers' weights (so the weights come from HBM, as in a forward) captured in
  one CUDA graph, µs per call; cuBLAS plus the separate Triton norm / SiLU kernels against the
  fused kernel at each tiling of a grid. The best tiling per (projection, row block) is kept.
Part 2, whole draft forwards (bass.bench.steps.StepTimer: runner, cache, CUDA graphs, LM head)
  at one and three tokens per sequence, fused (with part 1's tilings) against cuBLAS.
Usage: skinny_gemm.py OUT.json [--quick]
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bass.bench.steps import StepTimer, random_transformer, shape_config
from bass.kernels import triton_skinny
from bass.kernels.triton_elementwise import add_rms_norm, silu_mul
from bass.kernels.triton_skinny import Tiling, block_m, norm_linear

H, Q, KV, I, LAYERS = 896, 896, 128, 4864, 24
KINDS = {  # name: (cols, inner, norm + residual, bias, silu)
    "qkv": (Q + 2 * KV, H, True, True, False),
    "o": (H, Q, False, False, False),
    "gate_up": (I, H, True, False, True),
    "down": (H, I, False, False, False),
}


def graph_us(fn, replays: int = 20) -> float:
    """µs per replay of fn captured in a CUDA graph (median of 5 timings of `replays` replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / replays)
    return statistics.median(times)


def layer_weights(kind: str):
    cols, inner, norm, bias, silu = KINDS[kind]
    out_rows = 2 * cols if silu else cols
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = [(torch.randn(out_rows, inner, device="cuda", generator=gen) * 0.02).bfloat16() for _ in range(LAYERS)]
    b = [torch.randn(out_rows, device="cuda").bfloat16() for _ in range(LAYERS)] if bias else [None] * LAYERS
    g = torch.ones(inner, device="cuda", dtype=torch.bfloat16)
    return w, b, g


def per_call_us(kind: str, rows: int, tiling: Tiling | None) -> float:
    """µs per call of one projection group over LAYERS layers' weights; tiling None: cuBLAS."""
    cols, inner, norm, _, silu = KINDS[kind]
    w, b, g = WEIGHTS[kind]
    x = torch.randn(rows, inner, device="cuda").bfloat16()
    res = torch.randn(rows, inner, device="cuda").bfloat16()

    def unfused():
        for i in range(LAYERS):
            h = add_rms_norm(x, res, g, 1e-6)[0] if norm else x
            y = F.linear(h, w[i], b[i])
            if silu:
                silu_mul(y)

    def fused():
        for i in range(LAYERS):
            norm_linear(x, res if norm else None, g if norm else None, 1e-6, w[i], b[i], silu=silu, tiling=tiling)

    return graph_us(unfused if tiling is None else fused) / LAYERS


def main() -> None:
    out_path, quick = sys.argv[1], "--quick" in sys.argv
    global WEIGHTS
    WEIGHTS = {k: layer_weights(k) for k in KINDS}
    grid = [Tiling(n, k, w, s) for n, k, (w, s) in
            itertools.product((16, 32, 64), (64, 128, 256), ((4, 3), (2, 4), (4, 4)))]
    if quick:
        grid = grid[:4]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kinds": {}, "forwards": []}
    t0 = time.time()
    for kind, (cols, inner, _, _, silu) in KINDS.items():
        entry = report["kinds"][kind] = {}
        # Full grid at 8 rows; the five best there (and the default) at the other row counts.
        at8 = {t: per_call_us(kind, 8, t) for t in grid}
        ranked = sorted(at8, key=at8.get)
        for rows in (1, 3, 8, 16, 24, 32):
            cands = grid if rows == 8 else list(dict.fromkeys(ranked[:5] + [triton_skinny.DEFAULT_TILING]))
            timed = at8 if rows == 8 else {t: per_call_us(kind, rows, t) for t in cands}
            best = min(timed, key=timed.get)
            entry[rows] = {"cublas_us": per_call_us(kind, rows, None), "best_us": timed[best], "best": best._asdict(),
                           "default_us": timed.get(triton_skinny.DEFAULT_TILING)}
            triton_skinny.TILINGS[(cols, inner, silu, block_m(rows))] = best
            print(kind, rows, json.dumps(entry[rows]), f"{time.time() - t0:.0f}s", flush=True)
    # Part 2: whole forwards.
    config = shape_config("qwen2.5-coder-0.5b")
    model = random_transformer(config, dtype="bfloat16", device="cuda", max_seq_len=600, attention="triton")
    for batch in (1, 2, 4, 8, 16):
        row = {"batch": batch, "context": 500}
        for fused in (False, True):
            model.fuse_few_rows(32 if fused else 0)
            timer = StepTimer(model, batch=batch, context=500, max_q=3, attention="triton", cuda_graphs=True,
                              device="cuda")
            for q in (1, 3):
                if batch * q <= 32 or not fused:
                    row[f"{'fused' if fused else 'cublas'}_q{q}_ms"] = timer.time_forward(q, repeats=30).median_ms
            del timer
            torch.cuda.empty_cache()
        report["forwards"].append(row)
        print(json.dumps(row), flush=True)
    report["tilings"] = {f"{k[0]}x{k[1]}{'-silu' if k[2] else ''}-m{k[3]}": t._asdict()
                         for k, t in triton_skinny.TILINGS.items()}
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
