"""The CUDA decode attention (kernels/cuda/decode_attention.cu, kernels/cuda_attention.py): on a GPU,
one query token a sequence against the PyTorch reference (kernels/attention.attend_pad) over
contexts that take one block, several key splits and a split's several chunks, both head sizes
and the real pair's head groups; on the CPU, which batches it takes."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from bass.kernels.attention import attend_pad
from bass.kernels.batch import RaggedBatch, SequenceChunk
from bass.kernels.cuda_attention import DecodeAttention, load_decode_attention

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA or shutil.which("nvcc") is None, reason="needs a CUDA GPU and nvcc")


def _decode_batch(contexts: list[int], slots: list[int], device) -> RaggedBatch:
    """One token a sequence at the end of its context (the cache holds it)."""
    return RaggedBatch.build([SequenceChunk(slot=s, start=n - 1, tokens=[1], logit_rows=1)
                              for s, n in zip(slots, contexts)], device)


def test_takes_only_decode_steps_it_was_built_for():
    one = _decode_batch([5, 9], [0, 1], "cpu")
    assert DecodeAttention.takes(one, 14, 2, 64, torch.bfloat16)
    assert DecodeAttention.takes(one, 12, 2, 128, torch.bfloat16)
    assert not DecodeAttention.takes(one, 14, 2, 64, torch.float32)
    assert not DecodeAttention.takes(one, 14, 2, 80, torch.bfloat16)  # head size
    assert not DecodeAttention.takes(one, 18, 2, 64, torch.bfloat16)  # 9 query heads a KV head
    verify = RaggedBatch.build([SequenceChunk(slot=0, start=4, tokens=[1, 2, 3], logit_rows=3)], "cpu")
    assert not DecodeAttention.takes(verify, 14, 2, 64, torch.bfloat16)  # several tokens a sequence
    assert load_decode_attention(torch.device("cpu")) is None


@gpu
@pytest.mark.parametrize("heads,kv_heads,dim", [(14, 2, 64), (12, 2, 128), (8, 8, 64), (16, 2, 128)])
@pytest.mark.parametrize("contexts", [[1], [127, 128, 129], [513], [2000, 3, 700, 256, 1, 1024, 77, 900]])
def test_equals_the_reference(heads, kv_heads, dim, contexts):
    attention = load_decode_attention(torch.device("cuda"))
    assert attention is not None, "the CUDA kernel library did not build"
    gen = torch.Generator(device="cuda").manual_seed(len(contexts) * dim + heads)
    slots = list(range(len(contexts)))[::-1]  # sequence b in slot B - 1 - b
    max_len = 2048
    k_cache, v_cache = (torch.randn(len(contexts), max_len, kv_heads, dim, device="cuda", generator=gen).bfloat16()
                        for _ in range(2))
    q = torch.randn(len(contexts), heads, dim, device="cuda", generator=gen).bfloat16()
    batch = _decode_batch(contexts, slots, "cuda")
    want = attend_pad(q.float(), k_cache.float(), v_cache.float(), batch, dim ** -0.5)
    got = attention(q, k_cache, v_cache, batch, dim ** -0.5)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    assert torch.equal(attention(q, k_cache, v_cache, batch, dim ** -0.5), got)  # merged in a fixed order
    assert int(attention.arrivals.count_nonzero()) == 0  # counters left zeroed
    # Under a bound (a CUDA graph's plan): more splits than the contexts need, the same values.
    bounded = replace(batch, max_ctx=max_len, ctx_lens_are_bounds=True)
    torch.testing.assert_close(attention(q, k_cache, v_cache, bounded, dim ** -0.5).float(), want,
                               rtol=2e-2, atol=2e-2)
