"""Reference ragged attention: BASS-PAD and BASS-SPLIT in plain PyTorch.

Each query token at position p of a sequence attends to that sequence's cached keys at
positions 0..p (the cache already holds this step's keys). Grouped-query attention shares each
KV head among num_heads / num_kv_heads query heads.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from bass.kernels.batch import RaggedBatch

AttentionKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, RaggedBatch, float], torch.Tensor]


def attend_pad(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: RaggedBatch,
               scale: float) -> torch.Tensor:
    """BASS-PAD: pad queries to the longest chunk and keys to the longest context, mask, one call."""
    num_seqs, max_q, max_ctx = batch.num_seqs, batch.max_q, batch.max_ctx
    heads, head_dim = q.shape[1], q.shape[2]
    q_pad = q.new_zeros(num_seqs, max_q, heads, head_dim)
    q_pad[batch.token_seq, batch.token_offset] = q
    k = k_cache[batch.slots, :max_ctx]  # [B, max_ctx, kv_heads, D]
    v = v_cache[batch.slots, :max_ctx]
    # Query i of sequence b sits at position ctx_len - q_len + i; padded query rows look at key 0
    # only, so no softmax row is empty (their output is discarded).
    offsets = torch.arange(max_q, device=q.device)
    q_pos = (batch.ctx_lens - batch.q_lens)[:, None] + offsets[None, :]
    q_pos = torch.where(offsets[None, :] < batch.q_lens[:, None], q_pos, torch.zeros_like(q_pos))
    key_pos = torch.arange(max_ctx, device=q.device)
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, max_q, max_ctx]
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask[:, None], scale=scale, enable_gqa=True)
    return out.transpose(1, 2)[batch.token_seq, batch.token_offset]


def attend_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: RaggedBatch,
                 scale: float) -> torch.Tensor:
    """BASS-SPLIT: one attention call per sequence, no padding."""
    out = torch.empty_like(q)
    start = 0
    for slot, q_len, ctx in zip(batch.slots_list, batch.q_lens_list, batch.ctx_lens_list):
        qs = q[start:start + q_len].transpose(0, 1)  # [H, q_len, D]
        ks = k_cache[slot, :ctx].transpose(0, 1)
        vs = v_cache[slot, :ctx].transpose(0, 1)
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:start + q_len] = o.transpose(0, 1)
        start += q_len
    return out


ATTENTION_KERNELS: dict[str, AttentionKernel] = {"pad": attend_pad, "split": attend_split}


def attention_kernel(name: str) -> AttentionKernel:
    if name == "triton":  # imported only when asked for: CPU-only installs may lack Triton
        from bass.kernels.triton_attention import attend_triton

        return attend_triton
    try:
        return ATTENTION_KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown attention kernel {name!r}; known: {sorted(ATTENTION_KERNELS) + ['triton']}") from None
