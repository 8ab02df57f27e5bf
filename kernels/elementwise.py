"""Elementwise groups of the decoder layer, as transformers computes them (PyTorch references).

kernels/triton_elementwise.py fuses each group into one Triton kernel with the same rounding.
"""

from __future__ import annotations

import torch


# -- references (what transformers computes) ---------------------------------------------------------
def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); residual None means x alone."""
    summed = x if residual is None else x + residual
    h = summed.float() * inverse_rms(summed, eps)
    return weight * h.to(x.dtype), summed


def inverse_rms(rows: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms of each row, fp32 [rows, 1]."""
    h = rows.float()
    return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def scale_rows(product: torch.Tensor, norm_of: torch.Tensor, eps: float,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """What a product of normed rows is, from the product of the rows un-normed (the norm's
    weight folded into the product's weight, engine/fused_layers.py): each row scaled by
    1 / rms(its norm_of row), biased, rounded once to the product's dtype."""
    scaled = product.float() * inverse_rms(norm_of, eps)
    if bias is not None:
        scaled = scaled + bias.float()
    return scaled.to(product.dtype)


def silu_mul_reference(gate_up: torch.Tensor, paired: bool = False, norm_of: torch.Tensor | None = None,
                       eps: float = 0.0) -> torch.Tensor:
    """paired: gate|up columns in groups of 8 gates and their 8 ups (engine/fused_layers.py).
    norm_of: gate|up is the product of these rows un-normed (scale_rows)."""
    if norm_of is not None:
        gate_up = scale_rows(gate_up, norm_of, eps)
    if paired:
        groups = gate_up.unflatten(-1, (-1, 2, 8))
        gate, up = groups[..., 0, :].flatten(-2), groups[..., 1, :].flatten(-2)
    else:
        gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, D] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def rope_pair_order(head_dim: int) -> torch.Tensor:
    """A head's dims in the order a fused q|k|v product computes them (engine/fused_layers.py):
    groups of 16 columns, 8 dims of the first half then their 8 rotation partners (d + D / 2).
    Entry p is the dim at column p."""
    half = head_dim // 2
    return torch.tensor([(p // 16) * 8 + p % 16 if p % 16 < 8 else half + (p // 16) * 8 + p % 16 - 8
                         for p in range(head_dim)])


def rope_into_cache_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                              v_cache: torch.Tensor, token_slots: torch.Tensor, positions: torch.Tensor,
                              heads: int, kv_heads: int, paired: bool = False, norm_of: torch.Tensor | None = None,
                              eps: float = 0.0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The attention block's step between the q|k|v projection and attention: rotate q and k,
    write k and v into one layer's cache ([slots, max_seq_len, kv_heads, D]) at each token's
    (slot, position), return the rotated q [T, heads, D]. paired: the query and key heads'
    columns in rope_pair_order. norm_of, eps, bias: qkv is the product of these rows un-normed,
    without its bias (scale_rows)."""
    if bias is not None and norm_of is None:
        raise ValueError("a bias is added here only to an un-normed product (norm_of)")
    if norm_of is not None:
        qkv = scale_rows(qkv, norm_of, eps, bias)
    dim = cos.shape[-1]
    if paired:
        rotated = qkv[:, :(heads + kv_heads) * dim].unflatten(-1, (-1, dim))
        natural = torch.empty_like(rotated)
        natural[..., rope_pair_order(dim).to(qkv.device)] = rotated
        qkv = torch.cat((natural.flatten(-2), qkv[:, (heads + kv_heads) * dim:]), dim=-1)
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    k_cache[token_slots, positions] = rope_reference(k.view(-1, kv_heads, dim), cos, sin)
    v_cache[token_slots, positions] = v.view(-1, kv_heads, dim)
    return rope_reference(q.view(-1, heads, dim), cos, sin)
