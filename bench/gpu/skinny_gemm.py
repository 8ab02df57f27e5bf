"""Fused few-row kernels for the draft (skinny_kernel.py, an experiment) against what they replace.

On a GPU, no models needed: random weights at the 0.5B draft's shapes. Per projection of a layer
(q|k|v with its norm, o, gate|up with its norm and SiLU, down): 24 calls over 24 layers'
weights (so the weights come from HBM, as in a forward) captured in one CUDA graph, µs per call;
cuBLAS plus the separate Triton norm / SiLU kernels against the fused kernel at each tiling of a
grid, the best tiling kept per (projection, row block). (At 9441552, where the draft's model
could run these kernels, this script also timed whole draft forwards both ways: the
`forwards` of bench/results/2026-11-25-h100-fused-draft/skinny-gemm-9441552.json.)
Usage: skinny_gemm.py OUT.json [--quick]
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F

import skinny_kernel
from graph_timing import graph_us
from bass.kernels.triton_elementwise import add_rms_norm, silu_mul
from skinny_kernel import Tiling, block_m, norm_linear

H, Q, KV, I, LAYERS = 896, 896, 128, 4864, 24
KINDS = {  # name: (cols, inner, norm + residual, bias, silu)
    "qkv": (Q + 2 * KV, H, True, True, False),
    "o": (H, Q, False, False, False),
    "gate_up": (I, H, True, False, True),
    "down": (H, I, False, False, False),
}


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

    try:
        return graph_us(unfused if tiling is None else fused) / LAYERS
    except Exception as exc:  # a tiling that needs more shared memory than the GPU has
        print(kind, rows, tiling, type(exc).__name__, file=sys.stderr)
        return float("inf")


def main() -> None:
    out_path, quick = sys.argv[1], "--quick" in sys.argv
    global WEIGHTS
    WEIGHTS = {k: layer_weights(k) for k in KINDS}
    grid = [Tiling(n, k, w, s) for n, k, (w, s) in
            itertools.product((16, 32, 64), (64, 128, 256), ((4, 3), (2, 4), (4, 4)))]
    if quick:
        grid = grid[:4]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kinds": {}}
    t0 = time.time()
    for kind, (cols, inner, _, _, silu) in KINDS.items():
        entry = report["kinds"][kind] = {}
        # Full grid at 8 rows; the five best there (and the default) at the other row counts.
        at8 = {t: per_call_us(kind, 8, t) for t in grid}
        ranked = sorted(at8, key=at8.get)
        for rows in (1, 3, 8, 16, 24, 32):
            cands = grid if rows == 8 else list(dict.fromkeys(ranked[:5] + [skinny_kernel.DEFAULT_TILING]))
            timed = at8 if rows == 8 else {t: per_call_us(kind, rows, t) for t in cands}
            best = min(timed, key=timed.get)
            entry[rows] = {"cublas_us": per_call_us(kind, rows, None), "best_us": timed[best], "best": best._asdict(),
                           "default_us": timed.get(skinny_kernel.DEFAULT_TILING)}
            skinny_kernel.TILINGS[(cols, inner, silu, block_m(rows))] = best
            print(kind, rows, json.dumps(entry[rows]), f"{time.time() - t0:.0f}s", flush=True)
    report["tilings"] = {f"{k[0]}x{k[1]}{'-silu' if k[2] else ''}-m{k[3]}": t._asdict()
                         for k, t in skinny_kernel.TILINGS.items()}
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
