"""Ragged attention kernels against a naive per-query reference."""

import math

import pytest
import torch

from bass.kernels import ATTENTION_KERNELS
from bass.kernels.batch import RaggedBatch, SequenceChunk


def naive_attention(q, k_cache, v_cache, batch: RaggedBatch, scale):
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.zeros_like(q)
    t = 0
    for slot, q_len, ctx in zip(batch.slots_list, batch.q_lens_list, batch.ctx_lens_list):
        for i in range(q_len):
            pos = ctx - q_len + i
            for h in range(heads):
                keys = k_cache[slot, :pos + 1, h // group]
                vals = v_cache[slot, :pos + 1, h // group]
                w = torch.softmax((keys @ q[t, h]) * scale, dim=0)
                out[t, h] = w @ vals
            t += 1
    return out


@pytest.mark.parametrize("kernel", sorted(ATTENTION_KERNELS))
@pytest.mark.parametrize("shape", [
    # (query length, tokens already cached) per sequence: decode, verify k+1, prefill, mixed
    [(1, 5), (1, 0), (1, 17)],
    [(5, 3), (5, 10), (5, 0)],
    [(9, 0), (1, 12), (4, 4), (2, 30)],
])
def test_kernel_matches_naive(kernel, shape):
    torch.manual_seed(0)
    heads, kv_heads, dim, slots, max_len = 4, 2, 8, 6, 40
    k_cache = torch.randn(slots, max_len, kv_heads, dim)
    v_cache = torch.randn(slots, max_len, kv_heads, dim)
    chunks = [SequenceChunk(slot=s + 1, start=cached, tokens=[0] * q_len, logit_rows=0)
              for s, (q_len, cached) in enumerate(shape)]
    batch = RaggedBatch.build(chunks, "cpu")
    q = torch.randn(batch.num_tokens, heads, dim)
    scale = 1 / math.sqrt(dim)
    got = ATTENTION_KERNELS[kernel](q, k_cache, v_cache, batch, scale)
    torch.testing.assert_close(got, naive_attention(q, k_cache, v_cache, batch, scale), atol=1e-5, rtol=1e-5)


def test_keys_beyond_context_are_ignored():
    """Garbage past each sequence's context (rolled-back drafts) must not leak into attention."""
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(2, 16, 1, 4), torch.randn(2, 16, 1, 4)
    batch = RaggedBatch.build([SequenceChunk(slot=0, start=3, tokens=[0, 0], logit_rows=0),
                               SequenceChunk(slot=1, start=9, tokens=[0], logit_rows=0)], "cpu")
    q = torch.randn(3, 2, 4)
    before = {name: fn(q, k_cache, v_cache, batch, 0.5) for name, fn in ATTENTION_KERNELS.items()}
    k_cache[0, 5:] = 1e4
    v_cache[1, 10:] = -1e4
    for name, fn in ATTENTION_KERNELS.items():
        torch.testing.assert_close(fn(q, k_cache, v_cache, batch, 0.5), before[name])
