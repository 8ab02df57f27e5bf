"""Where the time of kernels/cuda/skinny_gemm.cu goes: the kernel built four times, as is and with
one stage replaced by a trivial stand-in (-DSKINNY_NO_WIDEN:
int8 bits passed on as bf16; -DSKINNY_NO_MMA: an xor instead of the tensor-core product), timed in
CUDA graphs at the pair's shapes. The stand-ins' results are wrong: timing only.

On a GPU: python bench/gpu/kernels/skinny_ablate.py OUT.json
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import bass.kernels.cuda_skinny as cs
from bass.kernels.triton_int8 import Int8Weight
from graph_timing import graph_us

SHAPES = {"draft qkv": (1152, 896, True), "draft gate_up": (9728, 896, True), "draft down": (896, 4864, True),
          "target qkv": (2048, 1536, False), "target gate_up": (17920, 1536, False), "target down": (1536, 8960, False)}
FLAGS = {"as is": [], "no widen": ["-DSKINNY_NO_WIDEN"], "no mma": ["-DSKINNY_NO_MMA"],
         "no widen, no mma": ["-DSKINNY_NO_WIDEN", "-DSKINNY_NO_MMA"]}


def build(flags: list[str]) -> cs.SkinnyGemm:
    so = Path(tempfile.mkdtemp()) / "k.so"
    major, minor = torch.cuda.get_device_capability()
    subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", *flags,
                    f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", "-o", str(so), str(cs._SOURCE)],
                   check=True)
    return cs.SkinnyGemm(ctypes.CDLL(str(so)))


def main() -> None:
    libs = {name: build(flags) for name, flags in FLAGS.items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "rows": []}
    for shape, (cols, inner, int8) in SHAPES.items():
        n = max(2, int(150e6 // (cols * inner * (1 if int8 else 2))) + 1)
        full = [(torch.randn(cols, inner, device="cuda", generator=gen) * 0.02).bfloat16() for _ in range(n)]
        ws = [Int8Weight.quantize(w) for w in full] if int8 else full
        for rows in (1, 8):
            x = torch.randn(rows, inner, device="cuda", generator=gen).bfloat16()
            out = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
            row = {"shape": shape, "rows": rows}
            for name, lib in libs.items():
                best = None
                for launch in [cs.Launch(cs.row_tiles_for(rows), g, w) for g in (1, 2, 4) for w in (4, 8, 16)]:
                    us = graph_us(lambda: [lib(x, w.q if int8 else w, w.scale if int8 else None, None, out, launch)
                                           for w in ws], n)
                    best = us if best is None else min(best, us)
                row[name] = round(best, 3)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        del ws, full
        torch.cuda.empty_cache()
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
