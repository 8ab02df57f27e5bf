"""Few-row products straight from a GGUF's k-quant blocks (Q4_K, Q6_K), with the very weights the
bf16 conversion holds.

The bundled 1.5B target ships as Q4_K_M: its projections are Q4_K (4.5 bits a weight) except half
the layers' v and down and the LM head, which are Q6_K (6.56 bits). `bass models` dequantizes them
to bf16, so a decode forward reads 3.1 GB of weights where the file has 1.0 GB; at 8 rows cuBLAS
spends 1.49 ms on the GEMMs of one forward (H100, DESIGN.md), bytes over bandwidth.

These kernels read the blocks instead and rebuild each weight in registers, in fp32, exactly as
gguf's dequantization does, then round it to bf16 as the converter does: Q4_K's (d * sc) * q and
dmin * m are exact in fp32 (11-bit d times a 6-bit scale times a 4-bit code), so the one
rounding of their difference, fused or not, gives gguf's value; Q6_K's (d * sc) * q is exact
outright. So the tensor cores multiply by the same bf16 weight the converted checkpoint holds;
only the order of the fp32 sums differs from cuBLAS (as between any two GEMM kernels).

The blocks are unpacked into planes once, at load time (`KQuantWeight.from_gguf_blocks`):
  Q4_K: codes uint8 [N, K/2] in the file's order (within each 64 inputs, byte l holds input l in
        its low nibble and input 32 + l in its high one); sc and m uint8 [N, K/32]; d and dmin
        fp32 [N, K/256];
  Q6_K: codes int8 [N, K] (q - 32, input order); sc int8 [N, K/16]; d fp32 [N, K/256].
Rows beyond `max_rows` (prefill, large batches) take cuBLAS on the bf16 weight, kept for them.

A long inner size (down: 8,960) splits K over the grid's third axis, the last split to arrive
summing the partials in order (kernels/triton_splitk.py). Programs cover 16 rows each and the
launch shape depends on the weight only, so a row's result does not depend on the rest of the
batch; row blocks vary fastest in launch order so that 17-64 rows read the weights from HBM once.

Not yet run on a GPU (2026-11-26): `bench/gpu/kquant.sh` measures it; `kquant_weights` is off
until then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_splitk import reduce_split_k  # noqa: E402

QK_K = 256  # inputs per k-quant super-block
Q4_K_BLOCK_BYTES = 144  # d, dmin (fp16), 12 bytes of packed 6-bit scales and mins, 128 bytes of codes
Q6_K_BLOCK_BYTES = 210  # 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d (fp16)
FORMATS = ("Q4_K", "Q6_K")

MAX_KQUANT_ROWS = 64
_BLOCK_M = 16  # rows per program by default: the smallest tensor-core block
_ARRIVAL_COUNTERS = 4096
# (BLOCK_N, chunks of 64 inputs per loop step, warps, stages, K splits): a first guess from the
# int8 kernel's tilings on the same shapes; bench/gpu/kquant_linear.py measures the grid.
_TILINGS = {"few_columns": (16, 2, 4, 3, 1), "many_columns": (32, 2, 4, 3, 1), "huge_columns": (64, 2, 4, 3, 1),
            "long_inner": (32, 2, 4, 3, 8)}


def tiling(cols: int, inner: int) -> tuple[int, int, int, int, int]:
    """The launch shape for a [cols, inner] weight. It never depends on the number of rows, so a
    row's result is the same whatever else is in the batch (seeds that hold)."""
    if inner >= 4096:
        return _TILINGS["long_inner"]
    if cols >= 65536:
        return _TILINGS["huge_columns"]
    return _TILINGS["many_columns"] if cols >= 4096 else _TILINGS["few_columns"]


def random_gguf_blocks(fmt: str, rows: int, inner: int, generator: torch.Generator,
                       device: str | torch.device = "cpu") -> torch.Tensor:
    """GGUF rows (uint8 [rows, bytes a row]) of random codes and scales, for benchmarks and tests:
    every bit pattern is a valid code, and the fp16 super-block scales are set small and
    positive: weights under 0.1, as in real models (random fp16 bits would include NaN and inf)."""
    size = {"Q4_K": Q4_K_BLOCK_BYTES, "Q6_K": Q6_K_BLOCK_BYTES}[fmt]
    raw = torch.randint(0, 256, (rows, inner // QK_K, size), dtype=torch.uint8, device=device, generator=generator)
    for start in ((0, 2) if fmt == "Q4_K" else (208,)):
        scale = torch.rand((rows, inner // QK_K, 1), device=device, generator=generator) * 1e-4 + 1e-6
        raw[..., start:start + 2] = scale.half().view(torch.uint8)
    return raw.reshape(rows, -1)


def _f16_field(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian fp16 at byte `start` of every block, as fp32: [N, S, bytes] -> [N, S]."""
    return blocks[..., start:start + 2].contiguous().view(torch.float16).squeeze(-1).float()


def unpack_q4_k(raw: torch.Tensor, inner: int) -> dict[str, torch.Tensor]:
    """GGUF Q4_K rows (uint8 [N, K/256 * 144]) -> the kernel's planes."""
    blocks = raw.reshape(raw.shape[0], inner // QK_K, Q4_K_BLOCK_BYTES)
    packed = blocks[..., 4:16].reshape(*blocks.shape[:2], 3, 4)
    low, high, mixed = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    # 8 six-bit scales and mins in 12 bytes: the first 4 of each sit in the low 6 bits of bytes
    # 0-3 / 4-7; the last 4 take their low nibble from bytes 8-11 and their top 2 bits from the
    # top of bytes 0-3 / 4-7 (llama.cpp's get_scale_min_k4).
    sc = torch.cat([low & 0x3F, (mixed & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([high & 0x3F, (mixed >> 4) | ((high >> 2) & 0x30)], dim=-1)
    return {"codes": blocks[..., 16:].reshape(raw.shape[0], inner // 2).contiguous(),
            "sc": sc.reshape(raw.shape[0], inner // 32).contiguous(),
            "m": mins.reshape(raw.shape[0], inner // 32).contiguous(),
            "d": _f16_field(blocks, 0).contiguous(), "dmin": _f16_field(blocks, 2).contiguous()}


def unpack_q6_k(raw: torch.Tensor, inner: int) -> dict[str, torch.Tensor]:
    """GGUF Q6_K rows (uint8 [N, K/256 * 210]) -> the kernel's planes."""
    rows, supers = raw.shape[0], inner // QK_K
    blocks = raw.reshape(rows, supers, Q6_K_BLOCK_BYTES)
    # Each half of 128 inputs: input 32 j + l takes the low (j = 0, 1) or high (j = 2, 3) nibble of
    # ql[64 h + 32 (j % 2) + l] and bits 2j..2j+1 of qh[32 h + l] as its top two bits.
    ql = blocks[..., :128].reshape(rows, supers, 2, 1, 64)
    ql = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(rows, supers, 2, 4, 32)
    qh = blocks[..., 128:192].reshape(rows, supers, 2, 1, 32)
    qh = torch.cat([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=3)
    codes = ((ql | (qh << 4)).to(torch.int16) - 32).to(torch.int8)
    return {"codes": codes.reshape(rows, inner).contiguous(),
            "sc": blocks[..., 192:208].contiguous().view(torch.int8).reshape(rows, inner // 16).contiguous(),
            "d": _f16_field(blocks, 208).contiguous()}


def dequantize_planes(fmt: str, planes: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fp32 weight [N, K] the planes encode, computed in gguf's order (tests; the bf16 copy)."""
    if fmt == "Q4_K":
        codes = planes["codes"]
        rows = codes.shape[0]
        q = torch.stack([codes.reshape(rows, -1, 32) & 0x0F, codes.reshape(rows, -1, 32) >> 4], dim=2)
        q = q.reshape(rows, -1, 32).float()  # [N, K/32, 32]: group g = 2c (low) or 2c + 1 (high)
        d = planes["d"].repeat_interleave(8, dim=1)
        dmin = planes["dmin"].repeat_interleave(8, dim=1)
        scale, offset = d * planes["sc"].float(), dmin * planes["m"].float()
        return (scale[..., None] * q - offset[..., None]).reshape(rows, -1)
    if fmt == "Q6_K":
        codes = planes["codes"]
        rows = codes.shape[0]
        scale = planes["d"].repeat_interleave(16, dim=1) * planes["sc"].float()
        return (scale[..., None] * codes.reshape(rows, -1, 16).float()).reshape(rows, -1)
    raise ValueError(f"unknown k-quant format {fmt!r}; known: {', '.join(FORMATS)}")


@dataclass(frozen=True)
class KQuantWeight:
    """A projection's weight [N, K] as k-quant planes (few rows) and in bf16 (many rows)."""

    fmt: str
    full: torch.Tensor
    planes: dict[str, torch.Tensor]

    @classmethod
    def from_gguf_blocks(cls, fmt: str, raw: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> "KQuantWeight":
        """From a GGUF tensor's raw rows (uint8 [N, bytes a row]), on raw's device."""
        sizes = {"Q4_K": (Q4_K_BLOCK_BYTES, unpack_q4_k), "Q6_K": (Q6_K_BLOCK_BYTES, unpack_q6_k)}
        if fmt not in sizes:
            raise ValueError(f"unknown k-quant format {fmt!r}; known: {', '.join(FORMATS)}")
        block_bytes, unpack = sizes[fmt]
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] % block_bytes:
            raise ValueError(f"{fmt} rows must be uint8 [N, a multiple of {block_bytes} bytes], got {raw.dtype} "
                             f"{tuple(raw.shape)}")
        planes = unpack(raw, raw.shape[1] // block_bytes * QK_K)
        return cls(fmt, dequantize_planes(fmt, planes).to(dtype), planes)


@dataclass(frozen=True)
class KQuantStack:
    """Projections fused along the outputs (q|k|v) whose formats differ (v is Q6_K in half the
    1.5B target's layers): one launch per run of equal formats, each into its own columns."""

    parts: tuple[KQuantWeight, ...]
    full: torch.Tensor


def fuse(parts: list["KQuantWeight | torch.Tensor"]) -> "KQuantWeight | KQuantStack | torch.Tensor":
    """Projections that share an input, stacked along the outputs. All k-quant: neighbours of one
    format merge into one weight (the planes are row-major per output), so q|k|v in Q4_K and
    gate|up are one launch. Any plain tensor among them (a format the kernels do not read):
    the plain bf16 stack, for cuBLAS."""
    full = torch.cat([p if isinstance(p, torch.Tensor) else p.full for p in parts])
    if any(isinstance(p, torch.Tensor) for p in parts):
        return full
    runs: list[list[KQuantWeight]] = []
    for part in parts:
        if runs and runs[-1][0].fmt == part.fmt and runs[-1][0].full.shape[1] == part.full.shape[1]:
            runs[-1].append(part)
        else:
            runs.append([part])
    merged = tuple(run[0] if len(run) == 1 else
                   KQuantWeight(run[0].fmt, torch.cat([p.full for p in run]),
                                {k: torch.cat([p.planes[k] for p in run]) for k in run[0].planes})
                   for run in runs)
    return merged[0] if len(merged) == 1 else KQuantStack(merged, full)


@triton.jit
def _to_bf16(w, EMULATE: tl.constexpr):
    """Round fp32 to bf16, to nearest even. The interpreter's cast truncates instead, so there (CPU
    tests) the rounding is done on the bits, and the value stays fp32."""
    if EMULATE:
        bits = w.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    else:
        return w.to(tl.bfloat16)


@triton.jit
def _store(acc, bias_ptr, out_ptr, rm, rn, rows, cols, out_stride, HAS_BIAS: tl.constexpr, EMULATE: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < cols, other=0.0).to(tl.float32)[None, :]
    if EMULATE and out_ptr.dtype.element_ty == tl.bfloat16:
        acc = _to_bf16(acc, EMULATE)  # rounded here, the interpreter's truncating cast below is exact
    tl.store(out_ptr + rm[:, None] * out_stride + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < rows) & (rn[None, :] < cols))


@triton.jit
def _q4_k_tile(codes_ptr, sc_ptr, m_ptr, d_ptr, dmin_ptr, wn, inner, k, j, HIGH: tl.constexpr,
               EMULATE: tl.constexpr):
    """bf16 weights [32, BLOCK_N] of columns wn for inputs k + 32 HIGH + j, k a multiple of 64."""
    byte = tl.load(codes_ptr + wn[None, :] * (inner // 2) + (k // 2 + j)[:, None])
    if HIGH:
        code = byte >> 4
    else:
        code = byte & 0x0F
    group = k // 32 + HIGH
    d = tl.load(d_ptr + wn * (inner // 256) + k // 256)
    dmin = tl.load(dmin_ptr + wn * (inner // 256) + k // 256)
    sc = tl.load(sc_ptr + wn * (inner // 32) + group).to(tl.float32)
    mn = tl.load(m_ptr + wn * (inner // 32) + group).to(tl.float32)
    return _to_bf16(code.to(tl.float32) * (d * sc)[None, :] - (dmin * mn)[None, :], EMULATE)


@triton.jit
def _q6_k_tile(codes_ptr, sc_ptr, d_ptr, wn, inner, k, j, EMULATE: tl.constexpr):
    """bf16 weights [32, BLOCK_N] of columns wn for inputs k + j (two groups of 16), k a multiple
    of 32."""
    code = tl.load(codes_ptr + wn[None, :] * inner + (k + j)[:, None]).to(tl.float32)
    sc_first = tl.load(sc_ptr + wn * (inner // 16) + k // 16).to(tl.float32)
    sc_second = tl.load(sc_ptr + wn * (inner // 16) + k // 16 + 1).to(tl.float32)
    sc = tl.where(j[:, None] < 16, sc_first[None, :], sc_second[None, :])
    d = tl.load(d_ptr + wn * (inner // 256) + k // 256)
    return _to_bf16(d[None, :] * sc * code, EMULATE)


@triton.jit(do_not_specialize=["rows"])
def _kquant_linear_kernel(x_ptr, codes_ptr, sc_ptr, m_ptr, d_ptr, dmin_ptr, bias_ptr, out_ptr, part_ptr,
                          arrivals_ptr, rows, cols, inner, k_per_split, out_stride,
                          FMT_Q4: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                          UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CHUNKS: tl.constexpr):
    # Row blocks vary fastest in launch order: the programs that read one column block's weights
    # run side by side, so 17-64 rows read them from HBM once and from L2 after.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 32)
    row_ok = rm[:, None] < rows
    col_ok = rn[None, :] < cols
    wn = tl.where(rn < cols, rn, 0)  # a ragged last block reads column 0's weights, never stored
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, inner)
    # inner and k_per_split are multiples of 64 CHUNKS, so every chunk lies inside [k_lo, k_hi).
    for k0 in range(k_lo, k_hi, 64 * CHUNKS):
        for c in tl.static_range(CHUNKS):
            k = k0 + 64 * c
            a_lo = tl.load(x_ptr + rm[:, None] * inner + (k + j)[None, :], mask=row_ok, other=0.0)
            a_hi = tl.load(x_ptr + rm[:, None] * inner + (k + 32 + j)[None, :], mask=row_ok, other=0.0)
            if FMT_Q4:
                w_lo = _q4_k_tile(codes_ptr, sc_ptr, m_ptr, d_ptr, dmin_ptr, wn, inner, k, j, 0, UPCAST)
                w_hi = _q4_k_tile(codes_ptr, sc_ptr, m_ptr, d_ptr, dmin_ptr, wn, inner, k, j, 1, UPCAST)
            else:
                w_lo = _q6_k_tile(codes_ptr, sc_ptr, d_ptr, wn, inner, k, j, UPCAST)
                w_hi = _q6_k_tile(codes_ptr, sc_ptr, d_ptr, wn, inner, k + 32, j, UPCAST)
            if UPCAST:  # the interpreter (CPU tests): its bf16 dot is wrong, fp32 is exact here
                acc += tl.dot(a_lo.to(tl.float32), w_lo)
                acc += tl.dot(a_hi.to(tl.float32), w_hi)
            else:
                acc += tl.dot(a_lo.to(tl.bfloat16), w_lo)
                acc += tl.dot(a_hi.to(tl.bfloat16), w_hi)
    if SPLIT:
        # part: [splits, row blocks * BLOCK_M, cols]; one counter per (row block, column block)
        last, total = reduce_split_k(acc, part_ptr, arrivals_ptr, rm[:, None] * cols + rn[None, :], row_ok & col_ok,
                                     pid_k, tl.num_programs(2), tl.num_programs(0) * BLOCK_M * cols,
                                     pid_n * tl.num_programs(0) + pid_m, BLOCK_M, BLOCK_N)
        if last:
            _store(total, bias_ptr, out_ptr, rm, rn, rows, cols, out_stride, HAS_BIAS, UPCAST)
    else:
        _store(acc, bias_ptr, out_ptr, rm, rn, rows, cols, out_stride, HAS_BIAS, UPCAST)


class KQuantLinear:
    """x @ w.T (+ bias) for KQuantWeight w: the k-quant kernel up to max_rows rows, cuBLAS on the
    bf16 weight beyond. Holds the split-K arrival counters of the model it serves."""

    def __init__(self, device: torch.device, max_rows: int = MAX_KQUANT_ROWS, fit_row_block: bool = False):
        """fit_row_block: one program covers up to 64 rows (16, 32 or 64 by the row count), so
        17-64 rows dequantize each weight once instead of once per 16 rows; but a row's sums then
        depend on how many rows came with it. Off (16 rows a program, results independent of the
        batch) until bench/gpu/kquant_linear.py says what it is worth."""
        self.max_rows = max_rows
        self.fit_row_block = fit_row_block
        self.arrivals = torch.zeros(_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
        if triton_attention._INTERPRETED:  # tensor loop bounds under NumPy >= 2.4 (see there)
            triton_attention._patch_interpreter_index()

    def __call__(self, x: torch.Tensor, weight: "KQuantWeight | KQuantStack | torch.Tensor",
                 bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, K] -> [rows, N] in out_dtype (default x's); into `out` (a column slice of a
        wider row-major tensor is fine) when given. A plain tensor weight (a projection the file
        does not store as k-quants) takes cuBLAS."""
        rows, inner = x.shape
        full = weight if isinstance(weight, torch.Tensor) else weight.full
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        if isinstance(weight, torch.Tensor) or rows > self.max_rows or rows == 0:
            result = F.linear(x, full, bias).to(out_dtype)
            if out is None:
                return result
            out.copy_(result)
            return out
        if isinstance(weight, KQuantStack):
            if out is None:
                out = torch.empty((rows, full.shape[0]), dtype=out_dtype, device=x.device)
            start = 0
            for part in weight.parts:
                end = start + part.full.shape[0]
                self(x, part, None if bias is None else bias[start:end], out=out[:, start:end])
                start = end
            return out
        cols = full.shape[0]
        x = x if x.is_contiguous() else x.contiguous()
        if out is None:
            out = torch.empty((rows, cols), dtype=out_dtype, device=x.device)
        elif out.shape != (rows, cols) or out.stride(1) != 1:
            raise ValueError(f"out must be [{rows}, {cols}] with unit column stride, got {tuple(out.shape)} "
                             f"strides {out.stride()}")
        block_n, chunks, warps, stages, splits = tiling(cols, inner)
        if inner % (64 * chunks):
            raise ValueError(f"inner size {inner} is not a multiple of {64 * chunks}")
        step = 64 * chunks
        k_per = triton.cdiv(triton.cdiv(inner, splits), step) * step
        splits = triton.cdiv(inner, k_per)
        block_m = min(64, max(_BLOCK_M, triton.next_power_of_2(rows))) if self.fit_row_block else _BLOCK_M
        grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n), splits)
        if splits > 1 and grid[0] * grid[1] > self.arrivals.numel():
            raise ValueError(f"a {rows}x{cols} split product needs {grid[0] * grid[1]} arrival counters, "
                             f"more than {self.arrivals.numel()}")
        part = (torch.empty((splits, grid[0] * block_m, cols), dtype=torch.float32, device=x.device)
                if splits > 1 else out)
        p = weight.planes
        q4 = weight.fmt == "Q4_K"
        _kquant_linear_kernel[grid](
            x, p["codes"], p["sc"], p["m"] if q4 else p["sc"], p["d"], p["dmin"] if q4 else p["d"],
            bias if bias is not None else p["d"], out, part, self.arrivals, rows, cols, inner, k_per, out.stride(0),
            FMT_Q4=q4, HAS_BIAS=bias is not None, SPLIT=splits > 1, UPCAST=triton_attention._INTERPRETED,
            BLOCK_M=block_m, BLOCK_N=block_n, CHUNKS=chunks, num_warps=warps, num_stages=stages)
        return out
