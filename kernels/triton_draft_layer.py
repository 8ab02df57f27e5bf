"""The int8 draft's decoder layer in seven launches instead of nine (Triton).

A draft forward of the 0.5B model at 1-16 rows is bound by its launches, not its bytes: on an
H100 (bench/gpu/profiling/draft_kernels.py) its 233 kernels run 0.90 ms of GPU time in a 1.08 ms
graph, the int8 products at ~5.5 µs each whatever they move, and the elementwise glue at
1.3-1.8 µs. Two pieces of glue ride on the products here:

- `qkv_rope`: the q|k|v product, its bias, RoPE, and the write of k and v into the cache;
- `gate_up_silu`: the gate|up product and SiLU(gate) * up.

The norms (with their residual adds) stay kernels of their own: folded into the products
(rms_norm(x) * w @ W.T = ((x * w) @ W.T) / rms(x), the squares gathered in the K loop) they made
each product 2-3 µs slower than the norm they saved (2026-11-27 journal, "draft layers").

Only a draft runs this (int8 weights, bf16 tensor-core products, its own rounding): its numbers
decide which tokens it proposes, and verification keeps the target's own, so the output is the
target's whatever they are. Up to MAX_INT8_ROWS rows; the model takes its unfused path beyond.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bass.kernels.triton_int8 import Int8Weight  # noqa: E402

_BLOCK_M = 16  # rows per program: the smallest tensor-core block
# (BLOCK_N, BLOCK_K, warps, stages): q|k|v programs cover BLOCK_N columns of each half of one head
# (the pairs RoPE mixes); gate|up programs BLOCK_N columns of the gate and the same of up.
QKV_TILING = (16, 128, 4, 4)
GATE_UP_TILING = (32, 128, 4, 4)


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    if UPCAST:  # the interpreter (CPU tests): its bf16 dot is wrong, fp32 is exact here
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))


@triton.jit(do_not_specialize=["rows"])
def _qkv_rope_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
                            q_ptr, k_cache_ptr, v_cache_ptr, rows, slot_stride, pos_stride,
                            INNER: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                            HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (p, m): head p // (HALF / BLOCK_N), columns j of both its halves, rows block m.
    Heads [0, HEADS) are queries (rotated into q), then KV_HEADS keys (rotated into the cache),
    then KV_HEADS values (into the cache as they are)."""
    pid = tl.program_id(0)
    head = pid // (HALF // BLOCK_N)
    j = (pid % (HALF // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    c1 = head * 2 * HALF + j  # the first half's columns; c1 + HALF are their RoPE partners
    rk = tl.arange(0, BLOCK_K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, INNER, BLOCK_K):
        kk = k + rk
        k_ok = kk < INNER
        a = tl.load(x_ptr + rm[:, None] * INNER + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b1 = tl.load(w_ptr + c1[None, :] * INNER + kk[:, None], mask=k_ok[:, None], other=0)
        b2 = tl.load(w_ptr + (c1 + HALF)[None, :] * INNER + kk[:, None], mask=k_ok[:, None], other=0)
        acc1 += _dot(a, b1, UPCAST)
        acc2 += _dot(a, b2, UPCAST)
    x1 = acc1 * tl.load(scale_ptr + c1)[None, :]
    x2 = acc2 * tl.load(scale_ptr + c1 + HALF)[None, :]
    if HAS_BIAS:
        x1 += tl.load(bias_ptr + c1).to(tl.float32)[None, :]
        x2 += tl.load(bias_ptr + c1 + HALF).to(tl.float32)[None, :]
    pos = tl.load(pos_ptr + rm, mask=row_ok, other=0)
    mask = row_ok[:, None]
    dt = q_ptr.dtype.element_ty
    if head < HEADS + KV_HEADS:
        table = pos[:, None] * 2 * HALF + j[None, :]
        cos1 = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
        cos2 = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
        sin1 = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
        sin2 = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
        r1 = x1 * cos1 - x2 * sin1
        r2 = x2 * cos2 + x1 * sin2
        if head < HEADS:
            out = q_ptr + (rm[:, None] * HEADS + head) * 2 * HALF + j[None, :]
            tl.store(out, r1.to(dt), mask=mask)
            tl.store(out + HALF, r2.to(dt), mask=mask)
        else:
            slot = tl.load(slot_ptr + rm, mask=row_ok, other=0)
            out = (k_cache_ptr + (slot * slot_stride + pos * pos_stride)[:, None] + (head - HEADS) * 2 * HALF
                   + j[None, :])
            tl.store(out, r1.to(dt), mask=mask)
            tl.store(out + HALF, r2.to(dt), mask=mask)
    else:
        slot = tl.load(slot_ptr + rm, mask=row_ok, other=0)
        out = (v_cache_ptr + (slot * slot_stride + pos * pos_stride)[:, None] + (head - HEADS - KV_HEADS) * 2 * HALF
               + j[None, :])
        tl.store(out, x1.to(dt), mask=mask)
        tl.store(out + HALF, x2.to(dt), mask=mask)


@triton.jit(do_not_specialize=["rows"])
def _gate_up_silu_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, rows, INNER: tl.constexpr,
                                COLS: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (n, m): columns n of SiLU(gate) * up (gate's columns n and up's COLS + n)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok, col_ok = rm < rows, rn < COLS
    rk = tl.arange(0, BLOCK_K)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, INNER, BLOCK_K):
        kk = k + rk
        k_ok = kk < INNER
        a = tl.load(x_ptr + rm[:, None] * INNER + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        bg = tl.load(w_ptr + rn[None, :] * INNER + kk[:, None], mask=w_mask, other=0)
        bu = tl.load(w_ptr + (rn + COLS)[None, :] * INNER + kk[:, None], mask=w_mask, other=0)
        gate += _dot(a, bg, UPCAST)
        up += _dot(a, bu, UPCAST)
    g = gate * tl.load(scale_ptr + rn, mask=col_ok, other=0.0)[None, :]
    u = up * tl.load(scale_ptr + rn + COLS, mask=col_ok, other=0.0)[None, :]
    tl.store(out_ptr + rm[:, None] * COLS + rn[None, :], (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def qkv_rope(x: torch.Tensor, qkv: Int8Weight, bias: torch.Tensor | None,
                    cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    token_slots: torch.Tensor, positions: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """The attention block from its normed input x to attention: x @ qkv.T + bias, q and k rotated by the
    cos/sin tables ([max positions, D]) at each token's position, k and v written into one
    layer's cache ([slots, max_seq_len, kv_heads, D]) at its (slot, position). Returns q
    [T, heads, D]. x: [T, hidden], contiguous."""
    rows, inner = x.shape
    dim = cos.shape[-1]
    half = dim // 2
    block_n, block_k, warps, stages = QKV_TILING
    block_n = min(block_n, half)
    if half % block_n or qkv.q.shape[0] != (heads + 2 * kv_heads) * dim:
        raise ValueError(f"q|k|v of {qkv.q.shape[0]} columns is not {heads} + 2 x {kv_heads} heads of {dim} "
                         f"in column blocks of {block_n}")
    q = torch.empty((rows, heads, dim), dtype=x.dtype, device=x.device)
    grid = ((heads + 2 * kv_heads) * (half // block_n), triton.cdiv(rows, _BLOCK_M))
    _qkv_rope_kernel[grid](
        x, qkv.q, qkv.scale, bias if bias is not None else qkv.scale, cos, sin, positions, token_slots,
        q, k_cache, v_cache, rows, k_cache.stride(0), k_cache.stride(1), INNER=inner, HEADS=heads,
        KV_HEADS=kv_heads, HALF=half, HAS_BIAS=bias is not None, UPCAST=triton_attention._INTERPRETED,
        BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return q


def gate_up_silu(x: torch.Tensor, gate_up: Int8Weight) -> torch.Tensor:
    """The MLP from its normed input x to its down product: SiLU(g) * u for (g | u) = x @ gate_up.T.
    x: [T, hidden], contiguous; returns [T, intermediate] in x's dtype."""
    rows, inner = x.shape
    cols = gate_up.q.shape[0] // 2
    block_n, block_k, warps, stages = GATE_UP_TILING
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(cols, block_n), triton.cdiv(rows, _BLOCK_M))
    _gate_up_silu_kernel[grid](
        x, gate_up.q, gate_up.scale, out, rows, INNER=inner, COLS=cols,
        UPCAST=triton_attention._INTERPRETED, BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages)
    return out
