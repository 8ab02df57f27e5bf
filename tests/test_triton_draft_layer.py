"""The int8 draft's fused layer kernels (kernels/triton_draft_layer.py) against the unfused
computation they replace (interpreter on the CPU), and a draft forward through them against the
model's unfused path."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.kernels.elementwise import rope_reference, silu_mul_reference  # noqa: E402
from bass.kernels.triton_draft_layer import gate_up_silu, qkv_rope  # noqa: E402
from bass.kernels.triton_int8 import Int8Weight  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The GPU's tensor cores read x in bf16; the CPU's interpreter computes in fp32.
TOL = dict(atol=3e-2, rtol=3e-2) if DEVICE == "cuda" else dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 5, 16, 19])
@pytest.mark.parametrize("with_bias", [True, False])
def test_qkv_rope_is_the_product_rope_and_cache_write(rows, with_bias):
    torch.manual_seed(rows)
    heads, kv_heads, dim, hidden = 4, 2, 32, 96
    dtype = torch.float32
    qkv = Int8Weight.quantize(torch.randn((heads + 2 * kv_heads) * dim, hidden, device=DEVICE) / hidden ** 0.5)
    bias = torch.randn((heads + 2 * kv_heads) * dim, device=DEVICE) if with_bias else None
    x = torch.randn(rows, hidden, device=DEVICE, dtype=dtype)
    positions = torch.randint(0, 40, (rows,), device=DEVICE)
    slots = torch.randperm(24, device=DEVICE)[:rows] if rows <= 24 else None
    slots = torch.arange(rows, device=DEVICE) % 24 if slots is None else slots
    angles = torch.outer(torch.arange(48, device=DEVICE, dtype=torch.float32), torch.rand(dim // 2, device=DEVICE))
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    k_cache = torch.full((24, 48, kv_heads, dim), 7.0, device=DEVICE)
    v_cache = torch.full_like(k_cache, 7.0)

    q = qkv_rope(x, qkv, bias, cos, sin, k_cache, v_cache, slots, positions, heads, kv_heads)

    product = F.linear(x.double(), qkv.dequantized().double(),
                       None if bias is None else bias.double()).float()
    want_q, want_k, want_v = product.split((heads * dim, kv_heads * dim, kv_heads * dim), -1)
    c, s = cos[positions], sin[positions]
    torch.testing.assert_close(q, rope_reference(want_q.view(rows, heads, dim), c, s), **TOL)
    # Distinct (slot, position) pairs are written; everything else stays as it was.
    written = torch.zeros(24, 48, dtype=torch.bool, device=DEVICE)
    written[slots, positions] = True
    pairs = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(slots, positions))}
    index = torch.tensor(list(pairs.values()), device=DEVICE)
    sl, ps = torch.tensor([p[0] for p in pairs], device=DEVICE), torch.tensor([p[1] for p in pairs], device=DEVICE)
    torch.testing.assert_close(k_cache[sl, ps], rope_reference(want_k.view(rows, kv_heads, dim), c, s)[index], **TOL)
    torch.testing.assert_close(v_cache[sl, ps], want_v.view(rows, kv_heads, dim)[index], **TOL)
    assert bool((k_cache[~written] == 7).all()) and bool((v_cache[~written] == 7).all())


@pytest.mark.parametrize("rows,cols", [(1, 96), (8, 100), (16, 33), (17, 64)])
def test_gate_up_silu_is_the_product_and_silu_times_up(rows, cols):
    torch.manual_seed(cols)
    hidden = 80
    gate_up = Int8Weight.quantize(torch.randn(2 * cols, hidden, device=DEVICE) / hidden ** 0.5)
    x = torch.randn(rows, hidden, device=DEVICE)
    got = gate_up_silu(x, gate_up)
    product = F.linear(x.double(), gate_up.dequantized().double()).float()
    assert got.shape == (rows, cols) and got.dtype == x.dtype
    torch.testing.assert_close(got, silu_mul_reference(product), **TOL)


@pytest.mark.parametrize("family", ["llama", "qwen"])  # Qwen2 has a q|k|v bias
def test_a_fused_draft_forward_matches_the_unfused_one(family, request):
    """The same int8 draft, the same cache contents: hidden rows and the cache's new entries
    from the seven-launch layers equal the unfused path's, to fp32 rounding (CPU) or bf16 (GPU);
    above MAX_INT8_ROWS tokens the model takes the unfused path."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    dtype = "bfloat16" if DEVICE == "cuda" else "float32"
    runner = ModelRunner(RunnerConfig(model_dir=request.getfixturevalue(f"{family}_draft"), device=DEVICE, dtype=dtype, num_slots=4,
                                      max_seq_len=64, attention="triton", int8_weights=True))
    model = runner.model
    assert model.fused_draft_layers
    runner.add([AddSequence(0, (3, 9, 27, 4, 11)), AddSequence(1, (8, 2))])
    states = [runner.get(0), runner.get(1)]
    lengths = [runner.cache.length(s.slot) for s in states]

    def run(fused, extra):
        model.fused_draft_layers = fused
        for s, n in zip(states, lengths):
            runner.cache.truncate(s.slot, n)
        logits = runner.forward([(s, list(extra)) for s in states], [1 + len(extra)] * 2)
        new = [runner.cache.k[:, s.slot, n:n + 1 + len(extra)].clone() for s, n in zip(states, lengths)]
        return logits, new

    tol = dict(atol=5e-2, rtol=5e-2) if DEVICE == "cuda" else dict(atol=1e-4, rtol=1e-4)
    calls = []
    fused_layers = model._fused_draft_hidden
    model._fused_draft_hidden = lambda *a: calls.append(a) or fused_layers(*a)
    for extra in ((), (5, 6, 7)):
        fused_logits, fused_k = run(True, extra)
        plain_logits, plain_k = run(False, extra)
        torch.testing.assert_close(fused_logits, plain_logits, **tol)
        for a, b in zip(fused_k, plain_k):
            torch.testing.assert_close(a, b, **tol)
    assert len(calls) == 2  # the fused runs took the seven-launch layers, the plain ones did not
    model.fused_draft_layers = True
    run(True, tuple(range(9)))  # 20 tokens: past MAX_INT8_ROWS, the unfused path
    assert len(calls) == 2
