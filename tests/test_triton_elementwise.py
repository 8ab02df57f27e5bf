"""Fused elementwise Triton kernels against their PyTorch references (interpreter on the CPU),
and the whole model on the fused path against transformers."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.kernels.elementwise import (add_rms_norm_reference, rope_into_cache_reference,  # noqa: E402
                                      silu_mul_reference)
from bass.kernels.triton_elementwise import add_rms_norm, rope_into_cache, silu_mul  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEVICE == "cuda" else [])


def close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    else:  # same rounding steps: at most one unit in the last place apart
        torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(dtype, with_residual):
    torch.manual_seed(0)
    x = torch.randn(7, 96, device=DEVICE).to(dtype)
    res = torch.randn(7, 96, device=DEVICE).to(dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(96, device=DEVICE)).to(dtype)
    out, summed = add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_sum = add_rms_norm_reference(x, res, w, 1e-6)
    close(out, ref_out, dtype)
    assert torch.equal(summed, ref_sum)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    torch.manual_seed(1)
    gate_up = (3 * torch.randn(5, 2 * 1500, device=DEVICE)).to(dtype)  # not a multiple of the block
    close(silu_mul(gate_up), silu_mul_reference(gate_up), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_paired(dtype):
    """Gate and up columns interleaved in groups of 8 (a fused draft's layout) give the same
    values as the halves layout they were taken from."""
    from bass.engine.fused_layers import pair_gate_up

    torch.manual_seed(2)
    halves = (3 * torch.randn(5, 2 * 1504, device=DEVICE)).to(dtype)  # 1504: 188 groups, not a block multiple
    paired = pair_gate_up(halves.T.contiguous()).T.contiguous()  # the rows of a weight are these columns
    assert not torch.equal(paired, halves)
    assert torch.equal(silu_mul_reference(paired, paired=True), silu_mul_reference(halves))
    close(silu_mul(paired, paired=True), silu_mul_reference(halves), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_into_cache(dtype):
    """Rotated q returned, rotated k and v written at each token's (slot, position), every
    other cache entry untouched; tokens of several sequences at scattered positions."""
    torch.manual_seed(2)
    tokens, heads, kv_heads, dim, slots, max_len = 6, 4, 2, 16, 3, 10
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device=DEVICE).to(dtype)
    angles = torch.randn(tokens, dim // 2, device=DEVICE)
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    token_slots = torch.tensor([2, 2, 0, 1, 1, 1], device=DEVICE)
    positions = torch.tensor([7, 8, 0, 3, 4, 9], device=DEVICE)
    caches = [torch.randn(2, slots, max_len, kv_heads, dim, device=DEVICE).to(dtype) for _ in range(2)]
    want = [c.clone() for c in caches]
    q = rope_into_cache(qkv, cos, sin, caches[0][1], caches[1][1], token_slots, positions, heads, kv_heads)
    q_ref = rope_into_cache_reference(qkv, cos, sin, want[0][1], want[1][1], token_slots, positions, heads,
                                      kv_heads)
    close(q, q_ref, dtype)
    close(caches[0], want[0], dtype)
    assert torch.equal(caches[1], want[1])  # values are copied, not computed
    v_of_token_0 = qkv[0, (heads + kv_heads) * dim:].view(kv_heads, dim)
    assert torch.equal(caches[1][1, 2, 7], v_of_token_0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_into_cache_from_paired_columns(dtype):
    """q|k|v whose query and key heads' columns are in rope_pair_order (a fused draft's layout)
    give the queries and cache entries of the natural layout they were taken from."""
    from bass.engine.fused_layers import pair_rope_heads

    torch.manual_seed(3)
    tokens, heads, kv_heads, dim, slots, max_len = 3, 4, 2, 32, 2, 8
    natural = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device=DEVICE).to(dtype)
    paired = pair_rope_heads(natural.T, heads, kv_heads, dim).T.contiguous()
    assert not torch.equal(paired, natural) and torch.equal(paired[:, -kv_heads * dim:], natural[:, -kv_heads * dim:])
    angles = torch.randn(tokens, dim // 2, device=DEVICE)
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    token_slots = torch.tensor([1, 0, 1], device=DEVICE)
    positions = torch.tensor([2, 5, 3], device=DEVICE)
    caches = [torch.zeros(slots, max_len, kv_heads, dim, device=DEVICE).to(dtype) for _ in range(4)]
    want = rope_into_cache_reference(natural, cos, sin, caches[0], caches[1], token_slots, positions, heads, kv_heads)
    ref = rope_into_cache_reference(paired, cos, sin, caches[2], caches[3], token_slots, positions, heads, kv_heads,
                                    paired=True)
    assert torch.equal(ref, want) and torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    caches[2].zero_()
    caches[3].zero_()
    q = rope_into_cache(paired, cos, sin, caches[2], caches[3], token_slots, positions, heads, kv_heads, paired=True)
    close(q, want, dtype)
    close(caches[2], caches[0], dtype)
    assert torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_of_an_unnormed_product(dtype):
    """norm_of: gate|up computed from un-normed rows x is scaled by 1 / rms(x) first, so the
    result is silu_mul of the normed rows' product."""
    from bass.kernels.elementwise import inverse_rms

    torch.manual_seed(4)
    x = (4 * torch.randn(5, 96, device=DEVICE)).to(dtype)
    w = torch.randn(2 * 1504, 96, device=DEVICE).to(dtype)
    unnormed = x @ w.T
    # What it means, in fp32 (in a narrower dtype the two orders round differently)
    normed = (x.float() * inverse_rms(x, 1e-6)) @ w.T.float()
    close(silu_mul_reference(unnormed.float(), paired=True, norm_of=x.float(), eps=1e-6),
          silu_mul_reference(normed, paired=True), torch.bfloat16)
    ref = silu_mul_reference(unnormed, paired=True, norm_of=x, eps=1e-6)
    close(silu_mul(unnormed, paired=True, norm_of=x, eps=1e-6), ref, dtype)
    assert not torch.allclose(silu_mul(unnormed, paired=True).float(), ref.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_rope_into_cache_of_an_unnormed_product(dtype, with_bias):
    """norm_of / bias: q|k|v of un-normed rows is scaled by 1 / rms(x) and biased before the
    rotation, for the queries, the keys and the values written to the cache."""
    from bass.kernels.elementwise import scale_rows

    torch.manual_seed(5)
    tokens, heads, kv_heads, dim, slots, max_len = 4, 4, 2, 32, 2, 8
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device=DEVICE).to(dtype)
    x = (3 * torch.randn(tokens, 80, device=DEVICE)).to(dtype)  # 80: not a power of two
    bias = torch.randn(qkv.shape[1], device=DEVICE).to(dtype) if with_bias else None
    angles = torch.randn(tokens, dim // 2, device=DEVICE)
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    token_slots = torch.tensor([1, 0, 1, 0], device=DEVICE)
    positions = torch.tensor([2, 5, 3, 0], device=DEVICE)
    caches = [torch.zeros(slots, max_len, kv_heads, dim, device=DEVICE).to(dtype) for _ in range(6)]
    scaled = scale_rows(qkv, x, 1e-6, bias)
    want = rope_into_cache_reference(scaled, cos, sin, caches[0], caches[1], token_slots, positions, heads,
                                     kv_heads, paired=True)
    ref = rope_into_cache_reference(qkv, cos, sin, caches[2], caches[3], token_slots, positions, heads, kv_heads,
                                    paired=True, norm_of=x, eps=1e-6, bias=bias)
    assert torch.equal(ref, want) and torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    q = rope_into_cache(qkv, cos, sin, caches[4], caches[5], token_slots, positions, heads, kv_heads, paired=True,
                        norm_of=x, eps=1e-6, bias=bias)
    close(q, want, dtype)
    close(caches[4], caches[0], dtype)
    close(caches[5], caches[1], dtype)
    assert caches[5].abs().sum() > 0
    with pytest.raises(ValueError, match="un-normed"):
        rope_into_cache(qkv, cos, sin, caches[4], caches[5], token_slots, positions, heads, kv_heads, bias=qkv[0])


def test_model_on_the_fused_path_matches_transformers(llama_target, qwen_target):
    from transformers import AutoModelForCausalLM

    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    ids = [5, 17, 33, 200, 7, 9, 11]
    for model_dir in (llama_target, qwen_target):
        runner = ModelRunner(RunnerConfig(model_dir=model_dir, num_slots=2, max_seq_len=64, attention="triton",
                                          device=DEVICE, cuda_graphs=False))
        runner.add([AddSequence(1, tuple(ids[:1]))])
        state = runner.get(1)
        runner.commit(state, ids[1:])
        ours = runner.forward([(state, [])], [len(ids)]).cpu()
        with torch.no_grad():
            ref = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
