"""The k-quant kernel (kernels/triton_kquant.py) against cuBLAS on the bf16 weight, per projection of
the 1.5B target and number of rows: µs per call over 28 layers' weights (2 copies of the LM head)
in one CUDA graph. At 8 rows it also walks a grid of tilings per projection, to place the product's.

Random blocks (every bit pattern is a valid code) with small positive fp16 scales stand for the
file's: the kernel's work does not depend on the values. Each JSON line is flushed as it comes, so
a run cut short keeps what it measured.

On a GPU, no models needed, PYTHONPATH with the bass build:
    python bench/gpu/kquant_linear.py OUT.jsonl [--grid]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from bass.kernels import triton_kquant as kq
from graph_timing import graph_us

# name: (format, output columns, inner size, copies)
PROJECTIONS = {
    "q|k|v": ("Q4_K", 2048, 1536, 28),
    "o": ("Q4_K", 1536, 1536, 28),
    "gate|up": ("Q4_K", 17920, 1536, 28),
    "down": ("Q4_K", 1536, 8960, 28),
    "down_q6": ("Q6_K", 1536, 8960, 28),
    "lm_head": ("Q6_K", 151936, 1536, 2),
}
ROWS = (1, 8, 16, 24, 32, 40, 48, 64)
GRID_ROWS = 8


def grid(cols: int, inner: int):
    """Column blocks x chunks a loop step at the product's split, then the splits at its blocks."""
    block_n0, chunks0, warps, stages, split0 = kq.tiling(cols, inner)
    for block_n in (16, 32, 64, 128):
        for chunks in (1, 2, 4):
            if (block_n, chunks) != (block_n0, chunks0):
                yield block_n, chunks, warps, stages, split0
    for split in (1, 2, 4, 8, 16) if inner >= 4096 else (2, 4):
        if split != split0 and -(-cols // block_n0) * 4 <= 4096:  # arrival counters at 64 rows
            yield block_n0, chunks0, warps, stages, split
    for stages in (2, 4):
        yield block_n0, chunks0, warps, stages, split0


def main(out_path: str, with_grid: bool) -> None:
    linear = kq.KQuantLinear(torch.device("cuda"), max_rows=max(ROWS))
    fitted = kq.KQuantLinear(torch.device("cuda"), max_rows=max(ROWS), fit_row_block=True)
    out = open(out_path, "w")  # noqa: SIM115 (open for the whole run)

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    emit({"device": torch.cuda.get_device_name(), "torch": torch.__version__})
    for name in PROJECTIONS:  # every projection with the product's tiling first, then the grid
        compare(name, linear, fitted, emit)
    if with_grid:
        for name in ("gate|up", "down", "lm_head", "down_q6", "q|k|v", "o"):
            walk_grid(name, linear, emit)


def build(name: str) -> list[kq.KQuantWeight]:
    fmt, cols, inner, copies = PROJECTIONS[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [kq.KQuantWeight.from_gguf_blocks(fmt, kq.random_gguf_blocks(fmt, cols, inner, gen, "cuda"))
            for _ in range(copies)]


def compare(name: str, linear: kq.KQuantLinear, fitted: kq.KQuantLinear, emit) -> None:
    """cuBLAS bf16 against the kernel, 16 rows a program and (past 16 rows) fitted row blocks."""
    fmt, cols, inner, copies = PROJECTIONS[name]
    weights = build(name)
    out_dtype = torch.float32 if name == "lm_head" else None
    # the kernel's weights are the bf16 weights, bit for bit (one-hot rows pick inputs)
    picks = torch.arange(16, device="cuda") * (inner // 16) + 7
    one_hot = torch.zeros(16, inner, dtype=torch.bfloat16, device="cuda")
    one_hot[torch.arange(16, device="cuda"), picks] = 1
    exact = torch.equal(linear(one_hot, weights[0], out_dtype=torch.float32), weights[0].full.float()[:, picks].T)
    def us(product, x) -> float:
        return round(graph_us(lambda: [product(x, w) for w in weights], copies), 3)

    for rows in ROWS:
        x = torch.randn(rows, inner, device="cuda").bfloat16()
        emit({"projection": name, "format": fmt, "rows": rows, "weights_exact": exact,
              "tiling": list(kq.tiling(cols, inner)),
              "cublas_bf16_us": us(lambda x, w: F.linear(x, w.full), x),
              "kquant_us": us(lambda x, w: linear(x, w, None, out_dtype), x),
              "kquant_fitted_rows_us": us(lambda x, w: fitted(x, w, None, out_dtype), x) if rows > 16 else None})
    del weights
    torch.cuda.empty_cache()


def walk_grid(name: str, linear: kq.KQuantLinear, emit) -> None:
    fmt, cols, inner, copies = PROJECTIONS[name]
    weights = build(name)
    out_dtype = torch.float32 if name == "lm_head" else None
    x = torch.randn(GRID_ROWS, inner, device="cuda").bfloat16()
    default_tiling = kq.tiling
    for tiling in grid(cols, inner):
        kq.tiling = lambda c, i, t=tiling: t
        try:
            us = round(graph_us(lambda: [linear(x, w, None, out_dtype) for w in weights], copies), 3)
        except Exception as exc:  # a tiling Triton cannot build (shared memory) is skipped
            us = f"{type(exc).__name__}: {str(exc)[:80]}"
        finally:
            kq.tiling = default_tiling
        emit({"projection": name, "rows": GRID_ROWS, "grid_tiling": list(tiling), "kquant_us": us})
    del weights
    torch.cuda.empty_cache()

if __name__ == "__main__":
    with torch.inference_mode():
        main(sys.argv[1], "--grid" in sys.argv[2:])
