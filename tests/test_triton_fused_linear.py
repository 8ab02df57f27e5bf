"""The fused projections (kernels/triton_fused_linear.py) against their unfused references, and
the model's fused path against its unfused one (Triton's interpreter on the CPU)."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.kernels.elementwise import add_rms_norm_reference, rope_into_cache_reference, silu_mul_reference  # noqa: E402
from bass.kernels.triton_fused_linear import FusedLinears, Tiling, row_bucket  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
ROWS = [1, 5, 17, 40]


def randn(*shape, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


def close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
    else:  # a GEMM's accumulation order differs from cuBLAS's: a unit or two in the last place
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)


def force(fused: FusedLinears, key: str, rows: int, tiling: Tiling) -> None:
    fused.chosen[(key, row_bucket(rows))] = tiling


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("split_k", [1, 2])
def test_norm_qkv_rope_into_cache(dtype, rows, split_k):
    heads, kv_heads, dim, hidden, slots, max_len = 4, 2, 32, 128, 3, 64
    x = randn(rows, hidden, dtype=dtype)
    norm = 1 + randn(hidden, dtype=dtype, scale=0.1, seed=1)
    w = randn((heads + 2 * kv_heads) * dim, hidden, dtype=dtype, scale=0.1, seed=2)
    bias = randn(w.shape[0], dtype=dtype, scale=0.1, seed=3)
    angles = torch.rand(rows, dim // 2, generator=torch.Generator().manual_seed(4)) * 6
    cos = torch.cat([angles.cos()] * 2, -1).to(DEVICE, dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(DEVICE, dtype)
    token_slots = torch.tensor([i % slots for i in range(rows)], device=DEVICE)
    positions = torch.tensor([i // slots for i in range(rows)], device=DEVICE)
    caches = [torch.zeros(slots, max_len, kv_heads, dim, dtype=dtype, device=DEVICE) for _ in range(4)]

    h, _ = add_rms_norm_reference(x, None, norm, 1e-6)
    ref_q = rope_into_cache_reference(F.linear(h, w, bias), cos, sin, caches[0], caches[1], token_slots, positions,
                                      heads, kv_heads)
    fused = FusedLinears(torch.device(DEVICE))
    force(fused, "qkv", rows, Tiling(16, 16, 64, split_k))
    q = fused.norm_qkv_rope_into_cache(x, norm, 1e-6, w, bias, cos, sin, caches[2], caches[3], token_slots,
                                       positions, heads, kv_heads)
    close(q, ref_q, dtype)
    close(caches[2], caches[0], dtype)  # keys, rotated
    close(caches[3], caches[1], dtype)  # values
    assert caches[3].abs().sum() > 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_linear_residual(dtype, rows, split_k):
    n, k = 48, 512  # three 16-column blocks: the last split-K tile is not the first to arrive
    a, residual = randn(rows, k, dtype=dtype), randn(rows, n, dtype=dtype, seed=1)
    w, bias = randn(n, k, dtype=dtype, scale=0.05, seed=2), randn(n, dtype=dtype, scale=0.1, seed=3)
    fused = FusedLinears(torch.device(DEVICE))
    force(fused, "o", rows, Tiling(16, 16, 128, split_k))
    out = fused.linear_residual("o", a, w, bias, residual)
    close(out, residual + F.linear(a, w, bias), dtype)
    again = fused.linear_residual("o", a, w, bias, residual)
    assert torch.equal(out, again)  # the split's partials are summed in one order, whoever arrives last
    assert not fused.arrivals.any()  # the counters are left zeroed for the next call


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("split_k", [1, 2])
def test_norm_gate_up_silu(dtype, rows, split_k):
    hidden, inter = 128, 96
    x = randn(rows, hidden, dtype=dtype)
    norm = 1 + randn(hidden, dtype=dtype, scale=0.1, seed=1)
    w = randn(2 * inter, hidden, dtype=dtype, scale=0.1, seed=2)
    h, _ = add_rms_norm_reference(x, None, norm, 1e-6)
    fused = FusedLinears(torch.device(DEVICE))
    force(fused, "gate_up", rows, Tiling(16, 32, 64, split_k))
    out = fused.norm_gate_up_silu(x, norm, 1e-6, w)
    close(out, silu_mul_reference(F.linear(h, w)), dtype)
    assert torch.equal(out, fused.norm_gate_up_silu(x, norm, 1e-6, w))
    assert not fused.arrivals.any()


def test_candidates_split_weights_with_few_column_blocks():
    fused = FusedLinears(torch.device(DEVICE))
    fused.num_sms = 132
    down = fused.candidates(1, n=1536, k=8960)
    assert all(t.block_m == 16 for t in down)
    # 1536 / 64 = 24 column blocks fill a fifth of 132 SMs: split until they fill it
    assert {(t.block_n, t.split_k) for t in down} >= {(16, 2), (32, 4), (64, 8)}
    # gate|up's 8960 / 32 = 280 blocks fill the device unsplit
    assert {t.split_k for t in fused.candidates(2, n=8960, k=1536) if t.block_n <= 32} == {1}
    # q|k|v walks 16 heads by half heads: 16 * 64 / 16 = 64 blocks, split in two
    qkv = fused.candidates(3, n=1536, k=1536, half=64, all_heads=16)
    assert all(64 % t.block_n == 0 for t in qkv) and Tiling(16, 16, 128, 4, 8, 3) in qkv


def test_model_fused_path_matches_unfused(tmp_path):
    """Forwards of a Qwen2-shaped model (q|k|v bias, head_dim 32) through the fused projections
    equal the unfused path's, and write the same KV cache."""
    from bass.engine.batch import RaggedBatch, SequenceChunk
    from bass.engine.kv_cache import KVCache
    from bass.engine.model import Transformer, TransformerConfig
    from bass.bench.steps import random_transformer

    config = TransformerConfig(architecture="Qwen2ForCausalLM", vocab_size=96, hidden_size=128, intermediate_size=256,
                               num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6,
                               rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False,
                               max_position_embeddings=64)
    plain = random_transformer(config, dtype="float32", device=DEVICE, max_seq_len=64, attention="triton")
    fused = Transformer(config, plain.weights, max_seq_len=64, attention="triton", fused_linear=True)
    assert plain.fused is None and fused.fused is not None
    caches = [KVCache(num_layers=2, num_slots=2, max_seq_len=64, num_kv_heads=2, head_dim=32, dtype=torch.float32,
                      device=DEVICE) for _ in range(2)]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (9, 4)]
    for model, cache in zip((plain, fused), caches):
        slots = [cache.allocate() for _ in prompts]
        chunks = [SequenceChunk(slot=s, start=0, tokens=p, logit_rows=2) for s, p in zip(slots, prompts)]
        for s, p in zip(slots, prompts):
            cache.append(s, p)
        model.out = model.forward(RaggedBatch.build(chunks, DEVICE), cache)
    torch.testing.assert_close(fused.out, plain.out, atol=2e-4, rtol=2e-4)
    for layer in range(2):
        torch.testing.assert_close(caches[1].k[layer], caches[0].k[layer], atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(caches[1].v[layer], caches[0].v[layer], atol=2e-4, rtol=2e-4)
