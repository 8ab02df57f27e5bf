"""Compile the few-row int8 product kernel for an H100 (sm_90) without a GPU: run as a script with
TRITON_INTERPRET=0 (tests/test_kernel_builds.py does), one JSON line a variant.

Tests on the CPU run the kernel in Triton's interpreter, which never builds them; a kernel the
real compiler rejects would pass CI and fail on the first GPU call. Triton bundles ptxas, so the
whole path (Triton IR, PTX, cubin) runs here. Covers every tiling the product launches. With
--registers each line also gives what the bundled `ptxas -v` reports for the variant
(registers, spill stores), the sizes of its async copies and its tensor-core instructions, as
bench/results quotes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # before Triton is imported

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as compile_kernel  # noqa: E402

from bass.kernels import triton_int8  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)


def build(fn, types: dict[str, str], constexprs: dict, warps: int, stages: int):
    """Compile fn as its launcher would: tensors are 16-byte aligned and the sizes of our shapes
    multiples of 16, which Triton specializes on (`rows` is left unspecialized)."""
    signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name not in constexprs and name != "rows"}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    return compile_kernel(source, target=H100, options={"num_warps": warps, "num_stages": stages})


def ptxas_report(ptx: str) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                              text=True)
    return ", ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", done.stdout + done.stderr))


def variants():
    int8_types = dict(x_ptr="*bf16", w_ptr="*i8", scale_ptr="*fp32", bias_ptr="*bf16", part_ptr="*fp32",
                      arrivals_ptr="*i32", rows="i32", cols="i32", inner="i32", k_per_split="i32")
    for cols, inner in ((1024, 896), (9728, 896), (896, 4864), (151936, 896)):
        block_n, block_k, warps, stages, splits = triton_int8._tiling(cols, inner)
        for out in ("*bf16", "*fp32"):
            yield (f"int8 {cols}x{inner} out {out}", triton_int8._int8_linear_kernel, {**int8_types, "out_ptr": out},
                   dict(HAS_BIAS=cols == 1024, SPLIT=splits > 1, UPCAST=False, BLOCK_M=triton_int8._BLOCK_M,
                        BLOCK_N=block_n, BLOCK_K=block_k), warps, stages)


def main(registers: bool) -> None:
    for name, fn, types, constexprs, warps, stages in variants():
        try:
            kernel = build(fn, types, constexprs, warps, stages)
            line = {"variant": name, "ok": True, "tiling": {**constexprs, "warps": warps, "stages": stages}}
            if registers:
                ptx = kernel.asm["ptx"]
                line["ptxas"] = ptxas_report(ptx)
                copies = re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, (0x\w+|\d+)", ptx)
                line["cp_async_bytes"] = sorted({int(size, 0) for size in copies})
                line["mma"] = sorted(set(re.findall(r"\b(?:wgmma|mma)\.[\w.]+", ptx)))
            print(json.dumps(line), flush=True)
        except Exception as exc:  # reported, not raised: every variant gets its line
            print(json.dumps({"variant": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}),
                  flush=True)


if __name__ == "__main__":
    main("--registers" in sys.argv[1:])
