"""A fused decoder layer's four products for steps of 17-64 tokens, in Triton (engine/fused_layers.py).

Steps of up to 16 tokens run each layer's products through the CUDA few-row kernel with their
norms, RoPE, KV-cache writes, residual adds and SiLU * up in its epilogues (kernels/cuda/
skinny_gemm.cu). Past 16 rows that kernel's mma.sync loop loses to cuBLAS (activation loads
grow with the rows; bench/results/journal/2026-11-27-h200-few-row-cuda.md), so a verification of
4-16 sequences (k + 1 rows each) and a regular step of 17-64 sequences ran cuBLAS and nine
launches a layer. Here the same products, with the same epilogues over the same prepared
weights, are Triton tiles whose dots the compiler lowers to Hopper's wgmma, pipelined over the
inner dimension:

    out.T [BLOCK_N weight rows, BLOCK_R token rows] = W [BLOCK_N, K] @ x.T [K, BLOCK_R]

The weight's rows fill the tensor cores' 64-row side and the step's tokens (padded to 16, 32
or 64) their narrow side, as cuBLAS's own kernels for such shapes do. Each program computes its
tile as two halves, the first and the second member of every pair of columns the epilogue
combines: SiLU(gate) * up (gate|up is interleaved in groups of 8 gates and their 8 ups) and
RoPE (q|k|v's heads in groups of 8 dims and their 8 rotation partners), so a pair meets in one
thread with no shuffle; products without pairs take the two halves of the tile.

Narrow weights (q|k|v, o, down: 1.5-2k output columns, a few dozen tiles for 132 multiprocessors)
split the inner dimension over programs; each stores its partial sums, and the last of a tile's
programs to arrive adds them in split order (the same bits every time) and runs the epilogue.
The input norm's 1 / rms(x row) comes from the activation tiles each program loads anyway (their
sums of squares travel with the partial sums): the norm's weight is folded into the projection.

Values: fp32 accumulation like cuBLAS, another summation order, so results differ from the
unfused path in the last bits (as the few-row kernel's do); not used in the batch-invariant mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention
from bass.kernels.cuda_skinny import Rope

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

_gdc = triton_attention._gdc
MIN_ROWS, MAX_ROWS = 1, 64
PAIR = 8  # the epilogue's pairs: 8 columns and their 8 partners in every group of 16


@dataclass(frozen=True)
class Tiling:
    """How one product is cut: BLOCK_N weight rows a program (two halves of BLOCK_N / 2), the
    inner dimension in `splits` runs of BLOCK_K steps, and the compiler's warps and stages."""

    block_n: int = 128
    splits: int = 1
    block_k: int = 64
    warps: int = 4
    stages: int = 4

    def k_per_split(self, inner: int) -> int:
        return triton.cdiv(triton.cdiv(inner, self.splits), self.block_k) * self.block_k


def block_rows(rows: int) -> int:
    """Token rows padded to the dot's narrow side (16, 32 or 64)."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def default_tiling(cols: int, inner: int) -> Tiling:
    """Enough programs for the multiprocessors: wide weights take a tile each, narrow ones
    split their inner dimension so that tiles x splits is about 128."""
    tiles = triton.cdiv(cols, 128)
    if tiles >= 96:
        return Tiling(block_n=128)
    splits = max(1, min(inner // 128, 128 // tiles))
    return Tiling(block_n=128, splits=splits)


@triton.jit
def _half_rows(pid, BLOCK_N: tl.constexpr, PAIRED: tl.constexpr):
    """The weight rows of a tile's first and second halves: with PAIRED, the first 8 and the
    last 8 of every group of 16; else the tile's first and second half."""
    HALF: tl.constexpr = BLOCK_N // 2
    i = tl.arange(0, HALF)
    if PAIRED:
        first = pid * BLOCK_N + (i // 8) * 16 + i % 8
        return first, first + 8
    first = pid * BLOCK_N + i
    return first, first + HALF


@triton.jit
def _store_plain(acc, cols_idx, r, row_ok, out_ptr, res_ptr, COLS: tl.constexpr, RESIDUAL: tl.constexpr):
    ok = (cols_idx[:, None] < COLS) & row_ok[None, :]
    at = r[None, :] * COLS + cols_idx[:, None]
    if RESIDUAL:
        acc += tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["rows"])
def _layer_product_kernel(
        x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, res_ptr, part_ptr, arrivals_ptr,
        cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, slot_stride, pos_stride,
        rows, eps,
        COLS: tl.constexpr, INNER: tl.constexpr, K_PER_SPLIT: tl.constexpr, SPLITS: tl.constexpr,
        HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr,
        ROPE: tl.constexpr, RESIDUAL: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rn_a, rn_b = _half_rows(pid, BLOCK_N, SILU or ROPE)
    r = tl.arange(0, BLOCK_R)
    row_ok = r < rows
    ok_a, ok_b = rn_a < COLS, rn_b < COLS
    rk = tl.arange(0, BLOCK_K)
    k_lo = split * K_PER_SPLIT
    acc_a = tl.zeros((HALF, BLOCK_R), dtype=tl.float32)
    acc_b = tl.zeros((HALF, BLOCK_R), dtype=tl.float32)
    squares = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if PDL:
        _gdc.gdc_wait()  # the activations (and the residual) come from the kernels before
    for k in range(0, K_PER_SPLIT, BLOCK_K):
        kk = k_lo + k + rk
        k_ok = kk < INNER
        w_a = tl.load(w_ptr + rn_a[:, None] * INNER + kk[None, :], mask=ok_a[:, None] & k_ok[None, :], other=0.0)
        w_b = tl.load(w_ptr + rn_b[:, None] * INNER + kk[None, :], mask=ok_b[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_ptr + r[None, :] * INNER + kk[:, None], mask=row_ok[None, :] & k_ok[:, None], other=0.0)
        if NORM:
            xf = xt.to(tl.float32)
            squares += tl.sum(xf * xf, axis=0)
        if HAS_SCALE:  # int8 weights, their column scales applied in the epilogue
            w_a = w_a.to(xt.dtype)
            w_b = w_b.to(xt.dtype)
        if UPCAST:  # the interpreter's dot has no bf16
            acc_a = tl.dot(w_a.to(tl.float32), xt.to(tl.float32), acc_a)
            acc_b = tl.dot(w_b.to(tl.float32), xt.to(tl.float32), acc_b)
        else:
            acc_a = tl.dot(w_a, xt, acc_a)
            acc_b = tl.dot(w_b, xt, acc_b)
    if PDL:
        _gdc.gdc_launch_dependents()

    last = True
    if SPLITS > 1:
        # part: [tiles, splits, 2 * HALF * BLOCK_R + BLOCK_R] fp32: both halves' sums, then the
        # rows' sums of squares over this split's inner positions.
        ENTRY: tl.constexpr = 2 * HALF * BLOCK_R + BLOCK_R
        tile_part = part_ptr + pid * SPLITS * ENTRY
        at = tl.arange(0, HALF)[:, None] * BLOCK_R + r[None, :]
        mine = tile_part + split * ENTRY
        tl.store(mine + at, acc_a)
        tl.store(mine + HALF * BLOCK_R + at, acc_b)
        tl.store(mine + 2 * HALF * BLOCK_R + r, squares)
        tl.debug_barrier()  # every thread's sums stored before the counter's release
        last = tl.atomic_add(arrivals_ptr + pid, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
        if last:
            acc_a = tl.zeros((HALF, BLOCK_R), dtype=tl.float32)
            acc_b = tl.zeros((HALF, BLOCK_R), dtype=tl.float32)
            squares = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for s in range(0, SPLITS):
                theirs = tile_part + s * ENTRY
                acc_a += tl.load(theirs + at, cache_modifier=".cg")
                acc_b += tl.load(theirs + HALF * BLOCK_R + at, cache_modifier=".cg")
                squares += tl.load(theirs + 2 * HALF * BLOCK_R + r, cache_modifier=".cg")
            tl.store(arrivals_ptr + pid, 0)  # zeroed for the next launch
    if last:
        if HAS_SCALE:
            acc_a *= tl.load(scale_ptr + rn_a, mask=ok_a, other=0.0)[:, None]
            acc_b *= tl.load(scale_ptr + rn_b, mask=ok_b, other=0.0)[:, None]
        if NORM:
            inv_rms = 1.0 / tl.sqrt(squares / INNER + eps)
            acc_a *= inv_rms[None, :]
            acc_b *= inv_rms[None, :]
        if HAS_BIAS:
            acc_a += tl.load(bias_ptr + rn_a, mask=ok_a, other=0.0).to(tl.float32)[:, None]
            acc_b += tl.load(bias_ptr + rn_b, mask=ok_b, other=0.0).to(tl.float32)[:, None]
        if SILU:
            # out [rows, COLS / 2]: group g's 8 gates and 8 ups give its 8 outputs
            act = acc_a / (1.0 + tl.exp(-acc_a)) * acc_b
            half_cols = pid * HALF + tl.arange(0, HALF)
            _store_plain(act, half_cols, r, row_ok, out_ptr, res_ptr, COLS // 2, False)
        elif ROPE:
            head = rn_a // HEAD_DIM
            p = rn_a % HEAD_DIM
            is_v = head >= HEADS + KV_HEADS
            rotated = head < HEADS + KV_HEADS
            is_q = head < HEADS
            is_k = rotated & (head >= HEADS)
            pos = tl.load(pos_ptr + r, mask=row_ok, other=0)
            slot = tl.load(slot_ptr + r, mask=row_ok, other=0)
            kv_at = slot * slot_stride + pos * pos_stride  # [BLOCK_R]
            # Rotated heads: p = 16 g + j (j < 8) is dim d = 8 g + j, its partner d + HEAD_DIM / 2.
            d = (p // 16) * 8 + p % 16
            partner = d + HEAD_DIM // 2
            rot = row_ok[None, :] & ok_a[:, None] & rotated[:, None]
            c = tl.load(cos_ptr + pos[None, :] * HEAD_DIM + d[:, None], mask=rot, other=0.0).to(tl.float32)
            sn = tl.load(sin_ptr + pos[None, :] * HEAD_DIM + d[:, None], mask=rot, other=0.0).to(tl.float32)
            first = acc_a * c - acc_b * sn
            second = acc_b * c + acc_a * sn
            q_at = (r[None, :] * HEADS + head[:, None]) * HEAD_DIM
            q_ok = rot & is_q[:, None]
            tl.store(q_ptr + q_at + d[:, None], first.to(q_ptr.dtype.element_ty), mask=q_ok)
            tl.store(q_ptr + q_at + partner[:, None], second.to(q_ptr.dtype.element_ty), mask=q_ok)
            k_at = kv_at[None, :] + (head[:, None] - HEADS) * HEAD_DIM
            k_ok = rot & is_k[:, None]
            tl.store(k_ptr + k_at + d[:, None], first.to(k_ptr.dtype.element_ty), mask=k_ok)
            tl.store(k_ptr + k_at + partner[:, None], second.to(k_ptr.dtype.element_ty), mask=k_ok)
            # Values keep their columns' order: both halves go where their columns say.
            v_base = kv_at[None, :] - (HEADS + KV_HEADS) * HEAD_DIM
            v_a = row_ok[None, :] & ok_a[:, None] & is_v[:, None]
            v_b = row_ok[None, :] & ok_b[:, None] & is_v[:, None]  # a pair shares its head
            tl.store(v_ptr + v_base + rn_a[:, None], acc_a.to(v_ptr.dtype.element_ty), mask=v_a)
            tl.store(v_ptr + v_base + rn_b[:, None], acc_b.to(v_ptr.dtype.element_ty), mask=v_b)
        else:
            _store_plain(acc_a, rn_a, r, row_ok, out_ptr, res_ptr, COLS, RESIDUAL)
            _store_plain(acc_b, rn_b, r, row_ok, out_ptr, res_ptr, COLS, RESIDUAL)


class LayerProducts:
    """The fused products (SkinnyLinear.fused's signature) for steps of 17-64 tokens.

    Holds the split scratch and the arrival counters (left zeroed by the kernel), and a tiling
    per weight shape (default_tiling unless given)."""

    def __init__(self, device: torch.device, tilings: dict[tuple[int, int], Tiling] | None = None,
                 programmatic: bool = False):
        self.device = device
        self.tilings = dict(tilings or {})
        self.interpreted = triton_attention._check_device(device)
        self.pdl = programmatic and triton_attention._programmatic_launch_available(device, self.interpreted)
        self.arrivals = torch.zeros(1 << 12, dtype=torch.int32, device=device)
        self.partials = torch.empty(1 << 21, dtype=torch.float32, device=device)
        if self.interpreted:  # tensor loop bounds under NumPy >= 2.4 (see there)
            triton_attention._patch_interpreter_index()

    def tiling(self, cols: int, inner: int) -> Tiling:
        return self.tilings.get((cols, inner)) or default_tiling(cols, inner)

    def __call__(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, norm_eps: float | None = None,
                 silu_pairs: bool = False, rope: Rope | None = None, tiling: Tiling | None = None) -> torch.Tensor:
        """out = epilogue(x @ w.T): x [rows <= 64, K] contiguous; weight [N, K] (bf16, or an
        Int8Weight: int8 with fp32 column scales); the epilogue as SkinnyGemm's (residual added,
        out may be the residual; norm_eps: rows scaled by 1 / rms(x row); silu_pairs: out [rows,
        N / 2]; rope: q, k and v written where it says, returns q_out)."""
        rows, inner = x.shape
        w = getattr(weight, "q", weight)
        scale = getattr(weight, "scale", None)
        cols = w.shape[0]
        if not MIN_ROWS <= rows <= MAX_ROWS:
            raise ValueError(f"the layer products take {MIN_ROWS}-{MAX_ROWS} rows, got {rows}")
        if w.shape[1] != inner or not x.is_contiguous() or not w.is_contiguous():
            raise ValueError(f"expected contiguous x [rows, {w.shape[1]}] and weight [N, K]; got {tuple(x.shape)}")
        pairs = silu_pairs or rope is not None
        tiling = tiling or self.tiling(cols, inner)
        if pairs and tiling.block_n % 16:
            raise ValueError(f"paired columns need tiles of whole 16-column groups, got {tiling}")
        if out is None:
            out = rope.q_out if rope is not None else torch.empty(
                (rows, cols // 2 if silu_pairs else cols), dtype=x.dtype, device=x.device)
        tiles = triton.cdiv(cols, tiling.block_n)
        block_r = block_rows(rows)
        k_per = tiling.k_per_split(inner)
        splits = triton.cdiv(inner, k_per)
        if splits > 1:
            need = tiles * splits * (tiling.block_n + 1) * block_r
            if need > self.partials.numel():
                self.partials = torch.empty(need, dtype=torch.float32, device=x.device)
            if tiles > self.arrivals.numel():
                self.arrivals = torch.zeros(tiles, dtype=torch.int32, device=x.device)
        if rope is not None:
            args = (rope.cos, rope.sin, rope.positions, rope.slots, rope.q_out, rope.k_cache, rope.v_cache,
                    rope.k_cache.stride(0), rope.k_cache.stride(1))
            heads, kv_heads, head_dim = rope.q_out.shape[1], rope.k_cache.shape[2], rope.q_out.shape[2]
        else:
            args = (x, x, x, x, x, x, x, 0, 0)
            heads = kv_heads = head_dim = 0
        meta = dict(COLS=cols, INNER=inner, K_PER_SPLIT=k_per, SPLITS=splits, HAS_SCALE=scale is not None,
                    HAS_BIAS=bias is not None, NORM=norm_eps is not None, SILU=silu_pairs, ROPE=rope is not None,
                    RESIDUAL=residual is not None, HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
                    UPCAST=self.interpreted and x.dtype != torch.float32, PDL=self.pdl,
                    BLOCK_R=block_r, BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
                    num_warps=tiling.warps, num_stages=tiling.stages)
        if self.pdl:
            meta["launch_pdl"] = True
        _layer_product_kernel[(tiles, splits)](
            x, w, scale if scale is not None else x, bias if bias is not None else x, out,
            residual if residual is not None else x, self.partials, self.arrivals, *args, rows,
            float(norm_eps or 0.0), **meta)
        return out
