"""The fused layer products for steps of 17-64 tokens (kernels/triton_layer_products.py): every
epilogue against the same computation in PyTorch, with and without a split inner dimension, and
a model's fused steps against its unfused path over the same prepared weights. On the CPU under
Triton's interpreter; tests/test_gpu_layer_products.py runs the compiled kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bass.engine.fused_layers import fold_norm, pair_gate_up, pair_rope_heads
from bass.kernels.cuda_skinny import Rope
from bass.kernels.elementwise import rope_into_cache_reference
from bass.kernels.triton_layer_products import LayerProducts, Tiling, block_rows, default_tiling

DEVICE = torch.device("cpu")
TILINGS = [Tiling(block_n=32), Tiling(block_n=64, splits=3), Tiling(block_n=128, splits=2, block_k=32)]


@pytest.fixture(scope="module")
def products() -> LayerProducts:
    return LayerProducts(DEVICE)


def _close(out, ref):
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 17, 33, 64])
@pytest.mark.parametrize("tiling", TILINGS, ids=str)
def test_a_plain_product_with_bias_and_a_residual_added_in_place(products, rows, tiling):
    gen = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((rows, 192), (80, 192), (80,)))  # 80: a ragged last tile
    _close(products(x, w, b, tiling=tiling), x @ w.T + b)
    stream = torch.randn(rows, 80, generator=gen)
    expected = stream + x @ w.T
    assert products(x, w, out=stream, residual=stream, tiling=tiling) is stream
    _close(stream, expected)
    assert not products.arrivals.any()  # the split's counters are left zeroed for the next launch


@pytest.mark.parametrize("tiling", TILINGS, ids=str)
def test_the_norm_scales_each_row_by_its_rms_over_the_whole_inner_dimension(products, tiling):
    gen = torch.Generator().manual_seed(1)
    x, w, g = torch.randn(40, 256, generator=gen) * 3, torch.randn(96, 256, generator=gen), torch.rand(256, generator=gen)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    _close(products(x, fold_norm(w, g), norm_eps=1e-6, tiling=tiling), normed @ w.T)


@pytest.mark.parametrize("tiling", TILINGS, ids=str)
def test_silu_pairs_give_silu_gate_times_up_in_the_intermediate_order(products, tiling):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(24, 128, generator=gen)
    gate, up = torch.randn(96, 128, generator=gen), torch.randn(96, 128, generator=gen)
    out = products(x, pair_gate_up(torch.cat([gate, up])), norm_eps=1e-6, silu_pairs=True, tiling=tiling)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert out.shape == (24, 96)
    _close(out, F.silu(normed @ gate.T) * (normed @ up.T))


@pytest.mark.parametrize("tiling", TILINGS, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_rope_rotates_q_and_k_and_writes_k_and_v_at_each_rows_slot_and_position(products, tiling, head_dim):
    heads, kv_heads, hidden, rows = 4, 2, 128, 20
    gen = torch.Generator().manual_seed(head_dim)
    qkv = torch.randn((heads + 2 * kv_heads) * head_dim, hidden, generator=gen)
    bias = torch.randn(qkv.shape[0], generator=gen)
    x = torch.randn(rows, hidden, generator=gen)
    positions = torch.randint(0, 50, (rows,), generator=gen)
    slots = torch.arange(rows) % 3
    angles = torch.rand(64, head_dim // 2, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    caches = [torch.zeros(3, 64, kv_heads, head_dim) for _ in range(4)]  # k, v: kernel; k, v: reference
    # Distinct positions per slot, so that no two rows write one cache entry.
    positions = torch.tensor([(i // 3) * 7 + s for i, s in enumerate(slots.tolist())])

    q = torch.empty(rows, heads, head_dim)
    paired_w = pair_rope_heads(qkv, heads, kv_heads, head_dim)
    paired_b = pair_rope_heads(bias, heads, kv_heads, head_dim)
    rope = Rope(cos, sin, positions, slots, q, caches[0], caches[1])
    assert products(x, paired_w, paired_b, rope=rope, tiling=tiling) is q
    ref_q = rope_into_cache_reference(x @ paired_w.T + paired_b, cos[positions], sin[positions], caches[2], caches[3],
                                      slots, positions, heads, kv_heads, paired=True)
    _close(q, ref_q.view(rows, heads, head_dim))
    _close(caches[0], caches[2])
    _close(caches[1], caches[3])
    assert caches[0].abs().sum() > 0 and caches[1].abs().sum() > 0


def test_int8_weights_take_their_column_scales(products):
    from bass.kernels.triton_int8 import Int8Weight

    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(30, 128, generator=gen), torch.randn(64, 128, generator=gen)
    weight = Int8Weight.quantize(w)
    ref = (x @ weight.q.float().T) * weight.scale
    _close(products(x, weight, tiling=Tiling(block_n=32, splits=2)), ref)


def test_bf16_operands_round_like_the_unfused_product(products):
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(33, 192, generator=gen).bfloat16(), torch.randn(64, 192, generator=gen).bfloat16()
    out = products(x, w, tiling=Tiling(block_n=64, splits=3))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), (x.float() @ w.float().T), rtol=1e-2, atol=2e-2)


def test_shapes_it_refuses(products):
    with pytest.raises(ValueError, match="1-64 rows"):
        products(torch.zeros(65, 64), torch.zeros(32, 64))
    with pytest.raises(ValueError, match="contiguous"):
        products(torch.zeros(64, 20)[:, :16], torch.zeros(32, 16))
    with pytest.raises(ValueError, match="16-column groups"):
        products(torch.zeros(4, 64), torch.zeros(64, 64), silu_pairs=True, tiling=Tiling(block_n=24))


def test_default_tilings_give_the_multiprocessors_work_and_rows_pad_to_the_dot():
    assert [block_rows(r) for r in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    gate_up, down = default_tiling(17920, 1536), default_tiling(1536, 8960)
    assert gate_up.splits == 1 and 17920 // gate_up.block_n >= 96
    assert 96 <= (1536 // down.block_n) * down.splits <= 132 and down.k_per_split(8960) % down.block_k == 0


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_models_wide_steps_run_fused_and_compute_its_unfused_function(qwen_wide_heads, batch_invariant):
    """The model of the real draft's head shape (fp32 on the CPU): steps of 17-64 tokens through
    the Triton layer products give the logits and the cache of the unfused path over the same
    prepared weights; the batch-invariant mode never fuses."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.model import Transformer
    from bass.engine.runner import ModelRunner
    from bass.engine.weights import load_config, load_weights

    config = load_config(qwen_wide_heads)
    model = Transformer(config, load_weights(qwen_wide_heads, config, dtype="float32", device="cpu"),
                        max_seq_len=96, attention="triton", wide_fused=True, batch_invariant=batch_invariant)
    if batch_invariant:
        assert not model.fused_layers and not model.fused_products
        return
    assert model.fused_layers and [most for most, _ in model.fused_products] == [64]
    product, calls = model.fused_products[0][1], []
    model.fused_products = [(64, lambda *args, **kw: calls.append(args[0].shape[0]) or product(*args, **kw))]
    runner = ModelRunner(RunnerConfig(model_dir=qwen_wide_heads, num_slots=4, max_seq_len=96, attention="triton",
                                      cuda_graphs=False), model=model)
    results = {}
    for fused in (True, False):
        model.fused_layers = fused
        runner.add([AddSequence(10 * fused + i, tuple(range(3 + i, 30 + 2 * i))) for i in range(2)])
        states = [runner.get(10 * fused + i) for i in range(2)]
        # a verification-shaped step: 2 sequences x 12 tokens (24 rows), then one of 40 rows
        logits = [runner.forward([(s, list(range(40, 51))) for s in states], [12, 12])]
        for s, n in zip(states, (12, 12)):
            runner.commit(s, list(range(40, 51))[:n - 1] + [5])
        logits.append(runner.forward([(states[0], list(range(60, 79))), (states[1], list(range(70, 90)))], [20, 21]))
        cache = [runner.cache.k[0][s.slot, :80].clone() for s in states]
        results[fused] = (logits, cache)
        runner.release([10 * fused + i for i in range(2)])
    # the two prompts' prefill (27 + 26 tokens) and both steps, four products a layer
    assert sorted(set(calls)) == [24, 41, 53] and len(calls) == 3 * 4 * config.num_layers
    for a, b in zip(results[True][0], results[False][0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# -- on a GPU: the compiled kernel (wgmma tiles, programmatic launch) ---------------------------

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize("programmatic", [False, True])
@pytest.mark.parametrize("rows", [17, 32, 40, 64])
def test_compiled_products_at_the_targets_shapes_match_fp32(rows, programmatic):
    """Each of the 1.5B target's products with its layer epilogue, in bf16, against fp32 PyTorch
    over the same bf16 operands; the default tilings (split inner dimensions included)."""
    dev = torch.device("cuda")
    lp = LayerProducts(dev, programmatic=programmatic)
    gen = torch.Generator(device=dev).manual_seed(rows)
    heads, kv_heads, head_dim, hidden, inter = 12, 2, 128, 1536, 8960

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * s).bfloat16()

    x = rnd(rows, hidden, s=2.0)
    normed = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6))
    # gate|up, normed, SiLU * up
    gate, up = rnd(inter, hidden, s=0.03), rnd(inter, hidden, s=0.03)
    act = lp(x, pair_gate_up(torch.cat([gate, up])), norm_eps=1e-6, silu_pairs=True)
    ref = F.silu(normed @ gate.float().T) * (normed @ up.float().T)
    torch.testing.assert_close(act.float(), ref, rtol=2e-2, atol=2e-2)
    # down, residual in place (a split inner dimension)
    stream = rnd(rows, hidden)
    expected = stream.float() + act.float() @ (w_down := rnd(hidden, inter, s=0.02)).float().T
    lp(act, w_down, out=stream, residual=stream)
    torch.testing.assert_close(stream.float(), expected, rtol=2e-2, atol=5e-2)
    # q|k|v with bias, norm, RoPE and the cache writes
    qkv, bias = rnd((heads + 2 * kv_heads) * head_dim, hidden, s=0.03), rnd((heads + 2 * kv_heads) * head_dim)
    positions = torch.arange(rows, device=dev) * 3 + 100
    slots = torch.arange(rows, device=dev)
    angles = torch.rand(600, head_dim // 2, device=dev, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1).bfloat16(), torch.cat([angles.sin()] * 2, -1).bfloat16()
    caches = [torch.zeros(rows, 600, kv_heads, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    q = torch.empty(rows, heads, head_dim, device=dev, dtype=torch.bfloat16)
    w, b = pair_rope_heads(qkv, heads, kv_heads, head_dim), pair_rope_heads(bias, heads, kv_heads, head_dim)
    lp(x, w, b, norm_eps=1e-6, rope=Rope(cos, sin, positions, slots, q, caches[0], caches[1]))
    ref_q = rope_into_cache_reference((normed @ w.float().T + b.float()).bfloat16(), cos[positions], sin[positions],
                                      caches[2], caches[3], slots, positions, heads, kv_heads, paired=True)
    torch.testing.assert_close(q.float(), ref_q.view(rows, heads, head_dim).float(), rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(caches[1].float(), caches[3].float(), rtol=2e-2, atol=5e-2)
    assert not lp.arrivals.any()


@gpu
def test_compiled_products_repeat_bit_for_bit_and_in_a_cuda_graph():
    dev = torch.device("cuda")
    lp = LayerProducts(dev, programmatic=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(40, 8960, device=dev, generator=gen).bfloat16()
    w = (torch.randn(1536, 8960, device=dev, generator=gen) * 0.02).bfloat16()
    first = lp(x, w).clone()
    out = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    lp(x, w, out=out)  # compiled before the capture
    with torch.cuda.graph(graph):
        lp(x, w, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first) and torch.equal(lp(x, w), first)


@gpu
def test_a_bf16_models_wide_steps_through_graphs_decode_as_unfused(qwen_wide_heads):
    """Verification-shaped steps of 4 sequences x 5 tokens (20 rows) on CUDA in bf16, replayed
    from the runner's CUDA graphs: logits close to the unfused path's and the same greedy tokens."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.model import Transformer
    from bass.engine.runner import ModelRunner
    from bass.engine.weights import load_config, load_weights

    config = load_config(qwen_wide_heads)
    results = {}
    for wide in (True, False):  # two models: a runner's graphs keep the path they captured
        model = Transformer(config, load_weights(qwen_wide_heads, config, dtype="bfloat16", device="cuda"),
                            max_seq_len=96, attention="triton", few_row_cuda=True, wide_fused=wide)
        assert [most for most, _ in model.fused_products] == ([16, 64] if wide else [16])
        runner = ModelRunner(RunnerConfig(model_dir=qwen_wide_heads, device="cuda", dtype="bfloat16", num_slots=8,
                                          max_seq_len=96, attention="triton"), model=model)
        runner.warm_up(graph_shapes=[(5, 5)])
        runner.add([AddSequence(i, tuple(range(3 + i, 30 + i))) for i in range(4)])
        states = [runner.get(i) for i in range(4)]
        logits, tokens = [], []
        for step in range(4):
            out = runner.forward([(s, [7 + step, 8, 9, 10]) for s in states], [5] * 4)
            logits.append(out.float())
            tokens.append(out.argmax(-1).tolist())
            for s in states:
                runner.commit(s, [7 + step, 8, 9, 10, 11])
        results[wide] = (torch.stack(logits), tokens)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=5e-2, atol=5e-2)
    assert results[True][1] == results[False][1]
