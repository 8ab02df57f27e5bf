"""The product's int8 kernel (kernels/triton_int8.py) against cuBLAS in bf16, per projection of the
0.5B draft and number of rows, to place MAX_INT8_ROWS: µs per call over 24 layers' weights (4
copies of the LM head) in one CUDA graph (graph_timing.py), as the weight-only experiment that
led to the kernel timed them (weight_only_gemm.py, retired to git history).

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kernels/int8_linear.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from bass.kernels.triton_int8 import Int8Linear, Int8Weight
from graph_timing import graph_us

H, Q, KV, I, VOCAB = 896, 896, 128, 4864, 151936  # the 0.5B draft's shapes
PROJECTIONS = {"qkv": (Q + 2 * KV, H, 24), "o": (H, Q, 24), "gate_up": (2 * I, H, 24), "down": (H, I, 24),
               "lm_head": (VOCAB, H, 4)}  # (output columns, inner size, copies)

ROWS = (1, 8, 16, 24, 32, 48, 64)


def main() -> None:
    linear = Int8Linear(torch.device("cuda"), max_rows=max(ROWS))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    for name, (cols, inner, copies) in PROJECTIONS.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        weights = [Int8Weight.quantize((torch.randn(cols, inner, device="cuda", generator=gen) * 0.02).bfloat16())
                   for _ in range(copies)]
        for rows in ROWS:
            x = torch.randn(rows, inner, device="cuda").bfloat16()
            out_dtype = torch.float32 if name == "lm_head" else None
            row = {"projection": name, "rows": rows,
                   "cublas_bf16_us": round(graph_us(lambda: [F.linear(x, w.full) for w in weights], copies), 3),
                   "int8_us": round(graph_us(lambda: [linear(x, w, None, out_dtype) for w in weights], copies), 3)}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
        weights = []  # free them before the next projection (a `del` would leave the lambdas above unresolved)
        torch.cuda.empty_cache()
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
