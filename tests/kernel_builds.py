"""Compile the few-row product kernels for an H100 (sm_90) without a GPU: run as a script with
TRITON_INTERPRET=0 (tests/test_kernel_builds.py does), one JSON line a variant.

Tests on the CPU run these kernels in Triton's interpreter, which never builds them; a kernel the
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

from bass.kernels import triton_int8, triton_kquant, triton_megakernel  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)


def build(fn, types: dict[str, str], constexprs: dict, warps: int, stages: int, unaligned: frozenset = frozenset()):
    """Compile fn as its launcher would: tensors are 16-byte aligned and the sizes of our shapes
    multiples of 16, which Triton specializes on (`rows` and `unaligned` are left unspecialized)."""
    signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name not in constexprs and name != "rows" and name not in unaligned}
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
                        BLOCK_N=block_n, BLOCK_K=block_k), warps, stages, frozenset())
    # The experimental draft megakernel (kernels/triton_megakernel.py), persistent, 0.5B draft
    # shapes on an H100's 132 programs: what its launcher passes.
    from bass.bench.steps import shape_config

    c = shape_config("qwen2.5-coder-0.5b")
    plan = triton_megakernel.MegaPlan.build(c, 132)
    act = "*bf16"
    mega_types = dict(ids_ptr="*i64", pos_ptr="*i64", slot_ptr="*i64", ctx_ptr="*i64", embed_ptr=act, wq_ptr="*i8",
                      ws_ptr="*fp32", qkv_bias_ptr=act, o_bias_ptr=act, in_norm_ptr=act, post_norm_ptr=act,
                      final_norm_ptr=act, cos_ptr=act, sin_ptr=act, k_cache=act, v_cache=act, x_ptr=act, q_ptr=act,
                      attn_ptr=act, act_ptr=act, out_ptr=act, apart_ptr="*fp32", alse_ptr="*fp32", part_ptr="*fp32",
                      counters_ptr="*i32", eps="fp32", qk_scale="fp32")
    mega_types.update({name: "i32" for name in triton_megakernel._draft_forward_kernel.arg_names
                       if name not in mega_types})
    yield ("megakernel 0.5B persistent", triton_megakernel._draft_forward_kernel, mega_types,
           dict(H=c.hidden_size, I=c.intermediate_size, HEADS=c.num_heads, KV_HEADS=c.num_kv_heads,
                HEAD_DIM=c.head_dim, HAS_QKV_BIAS=True, HAS_O_BIAS=False, O_SPLITS=plan.o_splits,
                DN_SPLITS=plan.dn_splits, BLOCK_M=triton_megakernel.MAX_ROWS, BK=plan.block_k, BW_QKV=plan.bw_qkv,
                BW_O=plan.bw_o, BW_GU=plan.bw_gu, BW_DN=plan.bw_dn, BLOCK_G=16, BLOCK_N=64, BLOCK_H=1024, STAGE=-1,
                PREFETCH=True, SPIN_LIMIT=triton_megakernel._SPIN_LIMIT, UPCAST=False, DOT_PRECISION="tf32",
                KV_LINES=1, SKIP=0), plan.num_warps, plan.num_stages,
           frozenset({"layer_arg", "num_layers", "qkv_width", "o_width", "gu_width", "dn_width"}))
    for fmt in triton_kquant.FORMATS:
        code = "*u8" if fmt == "Q4_K" else "*i8"
        types = dict(x_ptr="*bf16", codes_ptr=code, sc_ptr=code, m_ptr=code, d_ptr="*fp32", dmin_ptr="*fp32",
                     bias_ptr="*bf16", part_ptr="*fp32", arrivals_ptr="*i32", rows="i32", cols="i32", inner="i32",
                     k_per_split="i32", out_stride="i32")
        for cols, inner in ((2048, 1536), (17920, 1536), (1536, 8960), (151936, 1536)):
            block_n, chunks, warps, stages, splits = triton_kquant.tiling(cols, inner)
            for block_m in (16, 64):  # 64: fit_row_block at 33-64 rows
                for out in ("*bf16", "*fp32"):
                    yield (f"{fmt} {cols}x{inner} rows {block_m} out {out}", triton_kquant._kquant_linear_kernel,
                           {**types, "out_ptr": out},
                           dict(FMT_Q4=fmt == "Q4_K", HAS_BIAS=cols == 2048, SPLIT=splits > 1, UPCAST=False,
                                BLOCK_M=block_m, BLOCK_N=block_n, CHUNKS=chunks), warps, stages, frozenset())


def main(registers: bool) -> None:
    for name, fn, types, constexprs, warps, stages, unaligned in variants():
        try:
            kernel = build(fn, types, constexprs, warps, stages, unaligned)
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
