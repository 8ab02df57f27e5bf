"""Fused elementwise kernels for the decoder layer (Triton), tested against kernels/elementwise.py.

A decode step of a 1.5B model on an H100 spends about a third of its GPU time in ~200 tiny
elementwise kernels (RMSNorm in fp32 steps, rotate-half RoPE, SiLU * up, residual adds, KV
cache writes); see bench/results/README.md. Each group here is one kernel that rounds where the reference rounds
(every intermediate to the model dtype), so greedy outputs stay equal to transformers'.
"""

from __future__ import annotations

import torch

# Imported first: on a machine without a GPU it switches Triton to its interpreter (tests).
from bass.kernels import triton_attention  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, eps,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(out_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)

@triton.jit
def _inverse_rms(norm_ptr, row, n_hidden, eps, NORM_BLOCK: tl.constexpr):
    """1 / rms of row `row` of a [rows, n_hidden] matrix, in fp32."""
    cols = tl.arange(0, NORM_BLOCK)
    x = tl.load(norm_ptr + row * n_hidden + cols, mask=cols < n_hidden, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / n_hidden + eps)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, norm_ptr, n_cols, n_hidden, eps, BLOCK: tl.constexpr, PAIRED: tl.constexpr,
                     HAS_NORM: tl.constexpr, NORM_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PAIRED:  # groups of 16 columns: 8 gates, then their 8 ups
        gate_col = (cols // 8) * 16 + cols % 8
        up_col = gate_col + 8
    else:
        gate_col = cols
        up_col = n_cols + cols
    g = tl.load(gu_ptr + row * 2 * n_cols + gate_col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + up_col, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    if HAS_NORM:  # gate|up of the un-normed row: scaled here, rounded as a product's output is
        inv = _inverse_rms(norm_ptr, row, n_hidden, eps, NORM_BLOCK)
        g = (g * inv).to(dt).to(tl.float32)
        u = (u * inv).to(dt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (s * u).to(dt), mask=mask)


@triton.jit
def _rope_into_cache_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, slots_ptr, pos_ptr,
                            norm_ptr, bias_ptr, qkv_stride, slot_stride, pos_stride, heads, kv_heads, n_hidden, eps,
                            HALF: tl.constexpr, PAIRED: tl.constexpr, HAS_NORM: tl.constexpr,
                            HAS_BIAS: tl.constexpr, NORM_BLOCK: tl.constexpr):
    """One program per (token, head): heads [0, heads) are query heads, rotated into q_out;
    heads [heads, heads + kv_heads) are key/value heads, the key rotated and both written to
    the cache at the token's (slot, position). In q|k|v, head h's input starts at h * D.
    HAS_NORM: q|k|v is the product of the un-normed row (weights with the norm folded in), so
    each value is first scaled by 1 / rms(norm row) and, with HAS_BIAS, biased."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HALF)
    dt = q_out_ptr.dtype.element_ty
    src = qkv_ptr + token * qkv_stride + head * 2 * HALF
    if PAIRED:  # a head's columns in groups of 16: 8 first-half dims, then their 8 partners
        c1_at = (d // 8) * 16 + d % 8
        c2_at = c1_at + 8
    else:
        c1_at = d
        c2_at = HALF + d
    x1 = tl.load(src + c1_at).to(tl.float32)
    x2 = tl.load(src + c2_at).to(tl.float32)
    inv = 1.0
    if HAS_NORM:
        inv = _inverse_rms(norm_ptr, token, n_hidden, eps, NORM_BLOCK)
        x1 = x1 * inv
        x2 = x2 * inv
        if HAS_BIAS:
            x1 += tl.load(bias_ptr + head * 2 * HALF + c1_at).to(tl.float32)
            x2 += tl.load(bias_ptr + head * 2 * HALF + c2_at).to(tl.float32)
        x1 = x1.to(dt).to(tl.float32)  # rounded as the product's output would be
        x2 = x2.to(dt).to(tl.float32)
    c1 = tl.load(cos_ptr + token * 2 * HALF + d).to(tl.float32)
    c2 = tl.load(cos_ptr + token * 2 * HALF + HALF + d).to(tl.float32)
    s1 = tl.load(sin_ptr + token * 2 * HALF + d).to(tl.float32)
    s2 = tl.load(sin_ptr + token * 2 * HALF + HALF + d).to(tl.float32)
    # reference: x * cos + rotate_half(x) * sin, each product and the sum rounded to dtype
    o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
    if head < heads:
        out = q_out_ptr + (token * heads + head) * 2 * HALF
        tl.store(out + d, o1)
        tl.store(out + HALF + d, o2)
    else:
        kv_head = head - heads
        offset = (tl.load(slots_ptr + token) * slot_stride + tl.load(pos_ptr + token) * pos_stride
                  + kv_head * 2 * HALF)
        tl.store(k_cache_ptr + offset + d, o1)
        tl.store(k_cache_ptr + offset + HALF + d, o2)
        v_src = src + kv_heads * 2 * HALF
        v1 = tl.load(v_src + d)
        v2 = tl.load(v_src + HALF + d)
        if HAS_NORM:
            v1 = v1.to(tl.float32) * inv
            v2 = v2.to(tl.float32) * inv
            if HAS_BIAS:
                v_bias = bias_ptr + (head + kv_heads) * 2 * HALF
                v1 += tl.load(v_bias + d).to(tl.float32)
                v2 += tl.load(v_bias + HALF + d).to(tl.float32)
        tl.store(v_cache_ptr + offset + d, v1.to(dt))
        tl.store(v_cache_ptr + offset + HALF + d, v2.to(dt))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    _add_rms_norm_kernel[(rows,)](x, residual if residual is not None else x, weight, out, summed, cols, eps,
                                  HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(cols))
    return out, summed


def silu_mul(gate_up: torch.Tensor, paired: bool = False, norm_of: torch.Tensor | None = None,
             eps: float = 0.0) -> torch.Tensor:
    """paired: gate|up columns in groups of 8 gates and their 8 ups (engine/fused_layers.py).
    norm_of: gate|up is the product of these rows un-normed (kernels/elementwise.py's reference)."""
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, cols), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    hidden = norm_of.shape[1] if norm_of is not None else 1
    _silu_mul_kernel[(rows, triton.cdiv(cols, block))](
        gate_up, out, norm_of if norm_of is not None else gate_up, cols, hidden, eps, BLOCK=block, PAIRED=paired,
        HAS_NORM=norm_of is not None, NORM_BLOCK=triton.next_power_of_2(hidden))
    return out


def rope_into_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, token_slots: torch.Tensor, positions: torch.Tensor, heads: int,
                    kv_heads: int, paired: bool = False, norm_of: torch.Tensor | None = None, eps: float = 0.0,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/elementwise.rope_into_cache_reference in one launch (instead of two RoPEs and
    two indexed cache writes): qkv [T, (heads + 2 kv_heads) D] rows, caches of one layer
    [slots, max_seq_len, kv_heads, D], contiguous. paired: the query and key heads' columns in
    the order of kernels/elementwise.rope_pair_order. norm_of, eps, bias: qkv is the product of
    these rows un-normed, without its bias (the reference says how they are applied)."""
    tokens, dim = qkv.shape[0], cos.shape[-1]
    if bias is not None and norm_of is None:
        raise ValueError("a bias is added here only to an un-normed product (norm_of)")
    q = torch.empty((tokens, heads, dim), dtype=qkv.dtype, device=qkv.device)
    hidden = norm_of.shape[1] if norm_of is not None else 1
    _rope_into_cache_kernel[(tokens, heads + kv_heads)](
        qkv, q, k_cache, v_cache, cos, sin, token_slots, positions, norm_of if norm_of is not None else qkv,
        bias if bias is not None else qkv, qkv.stride(0), k_cache.stride(0), k_cache.stride(1), heads, kv_heads,
        hidden, eps, HALF=dim // 2, PAIRED=paired, HAS_NORM=norm_of is not None, HAS_BIAS=bias is not None,
        NORM_BLOCK=triton.next_power_of_2(hidden))
    return q
