"""The weight layout of a fused draft (engine/fused_layers.py): the norms folded into the
projections, gate|up and the rotary halves of q|k|v paired compute the function of the original
weights on the unfused path,
which runs every step of more than 16 tokens (and every step on the CPU). The fused products
themselves run on a GPU only (tests/test_cuda_skinny.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from bass.engine.fused_layers import can_fuse, fold_norm, pair_gate_up, prepare_weights
from bass.engine.model import Transformer
from bass.engine.weights import load_config, load_weights


def test_pairing_interleaves_eight_gates_with_their_eight_ups():
    gate = torch.arange(16).repeat_interleave(3).view(16, 3).float()
    up = 100 + gate
    paired = pair_gate_up(torch.cat([gate, up]))
    assert paired[:, 0].tolist() == [*range(8), *range(100, 108), *range(8, 16), *range(108, 116)]
    with pytest.raises(ValueError, match="divisible by 8"):
        pair_gate_up(torch.zeros(2 * 12, 4))


def test_prepared_weights_compute_the_same_logits_on_the_unfused_path(qwen_wide_heads):
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    config = load_config(qwen_wide_heads)
    assert can_fuse(config) and config.head_dim == 64
    original = load_weights(qwen_wide_heads, config, dtype="float32", device="cpu")
    prepared = load_weights(qwen_wide_heads, config, dtype="float32", device="cpu")
    # Norm weights away from 1 and a q|k|v bias away from 0, so that folding and pairing them is
    # tested, not skipped.
    for a, b in zip(original.layers, prepared.layers):
        for name, base in (("input_norm", 1), ("post_norm", 1), ("qkv_bias", 0)):
            g = base + 0.3 * torch.randn_like(getattr(a, name))
            setattr(a, name, g)
            setattr(b, name, g.clone())
    gate_up_before = prepared.layers[0].gate_up.clone()
    prepare_weights(prepared, config)
    layer = prepared.layers[0]
    assert torch.equal(layer.input_norm, torch.ones_like(layer.input_norm))
    assert torch.equal(layer.post_norm, torch.ones_like(layer.post_norm))
    assert not torch.equal(layer.gate_up, gate_up_before)
    assert not torch.equal(layer.qkv[:64], fold_norm(original.layers[0].qkv, original.layers[0].input_norm)[:64])
    assert layer.qkv_bias is not None and not torch.equal(layer.qkv_bias, original.layers[0].qkv_bias)

    logits = []
    for weights, paired in ((original, False), (prepared, True)):
        model = Transformer(config, weights, max_seq_len=64, attention="pad")
        assert not model.fused_layers  # no CUDA kernel here: the layout only, set by hand below
        if paired:
            model.silu_mul = functools.partial(model.silu_mul, paired=True)
            model.rope_into_cache = functools.partial(model.rope_into_cache, paired=True)
        runner = ModelRunner(RunnerConfig(model_dir=qwen_wide_heads, num_slots=1, max_seq_len=64, attention="pad"),
                             model=model)
        runner.add([AddSequence(0, tuple(range(3, 30)))])
        state = runner.get(0)
        logits.append(runner.forward([(state, [7, 8, 9])], [3]))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)


def _with_moved_norms(weights):
    """Norm weights away from 1 and a q|k|v bias away from 0, so that folding them is tested."""
    gen = torch.Generator().manual_seed(5)
    for layer in weights.layers:
        for name, base in (("input_norm", 1), ("post_norm", 1), ("qkv_bias", 0)):
            t = getattr(layer, name)
            setattr(layer, name, base + 0.3 * torch.randn(t.shape, generator=gen).to(t.device))
    return weights


@pytest.mark.parametrize("attention", ["pad", "triton"])
def test_folded_layers_compute_the_original_function(qwen_wide_heads, attention):
    """A model whose norms are folded (Transformer.fold_norms) runs every step the fused products
    do not take through _folded_hidden: un-normed products, the norm applied by the kernel after
    each, residual adds in the o and down products. Its logits, its KV cache and its greedy tokens
    are the original weights' on the unfused path: for a prefill and for a ragged step of three
    sequences (1, 4 and 9 tokens)."""
    if attention == "triton":
        pytest.importorskip("triton")
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    device = "cuda" if attention == "triton" and torch.cuda.is_available() else "cpu"  # Triton: GPU or interpreter
    config = load_config(qwen_wide_heads)
    results = []
    for fold in (False, True):
        weights = _with_moved_norms(load_weights(qwen_wide_heads, config, dtype="float32", device=device))
        model = Transformer(config, weights, max_seq_len=64, attention=attention)
        if fold:
            model.fold_norms()
        calls = []
        original_hidden = model._folded_hidden
        model._folded_hidden = lambda *a: calls.append(1) or original_hidden(*a)
        runner = ModelRunner(RunnerConfig(model_dir=qwen_wide_heads, num_slots=3, max_seq_len=64,
                                          attention=attention, device=device, cuda_graphs=False), model=model)
        runner.add([AddSequence(s, tuple(range(3 + s, 20 + 2 * s))) for s in range(3)])
        states = [runner.get(s) for s in range(3)]
        step = [(states[0], [7]), (states[1], [8, 9, 10, 11]), (states[2], list(range(40, 49)))]
        logits = runner.forward(step, [1, 4, 9])
        assert bool(calls) == fold  # the folded path ran, and only for the folded model
        results.append((logits.cpu(), runner.cache.k.cpu(), runner.cache.v.cpu()))
    (want, want_k, want_v), (got, got_k, got_v) = results
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_v, want_v, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_only_shapes_the_kernel_takes_are_fused(qwen_wide_heads):
    from dataclasses import replace

    config = load_config(qwen_wide_heads)
    assert can_fuse(config)
    assert not can_fuse(replace(config, hidden_size=96))  # not a whole number of 64-wide int8 chunks
    assert not can_fuse(replace(config, head_dim=24, num_heads=8))  # heads not of whole 16-column groups
    assert not can_fuse(replace(config, intermediate_size=324))


def test_without_the_kernel_nothing_is_fused_or_changed(qwen_target):
    config = load_config(qwen_target)
    weights = load_weights(qwen_target, config, dtype="float32", device="cpu")
    gate_up = weights.layers[0].gate_up.clone()
    model = Transformer(config, weights, max_seq_len=32, attention="pad", few_row_cuda=True, fuse_layers=True)
    assert not model.fused_layers and torch.equal(model.weights.layers[0].gate_up, gate_up)


def test_only_steps_of_the_second_row_group_time_two_layer_paths(qwen_wide_heads):
    """Steps of 9-16 tokens may run the fused layers or the folded ones (whichever timed faster
    at capture, engine/graphs.py); 1-8 and more than 16 have one path, and a model without fused
    layers (here: no kernel on the CPU) only its own."""
    config = load_config(qwen_wide_heads)
    model = Transformer(config, load_weights(qwen_wide_heads, config, dtype="float32", device="cpu"), max_seq_len=32,
                        attention="pad")
    assert not model.fused_layers and model.layer_paths(12) == (True,)
    model.fused_layers = True  # as a GPU with the kernel builds it
    assert {rows: model.layer_paths(rows) for rows in (1, 8, 9, 16, 17, 64)} == {
        1: (True,), 8: (True,), 9: (True, False), 16: (True, False), 17: (True,), 64: (True,)}
    model.time_layer_paths = False
    assert model.layer_paths(12) == (True,)


def test_a_step_not_fused_by_choice_runs_the_folded_layers(qwen_wide_heads):
    """hidden(fused=False) on a model with fused layers takes the folded path (the function of the
    original weights), never the fused products."""
    from bass.kernels.batch import RaggedBatch, SequenceChunk
    from bass.engine.kv_cache import KVCache

    config = load_config(qwen_wide_heads)
    hidden = {}
    for fold in (False, True):
        weights = _with_moved_norms(load_weights(qwen_wide_heads, config, dtype="float32", device="cpu"))
        model = Transformer(config, weights, max_seq_len=32, attention="pad")
        if fold:
            model.fold_norms()
            model.fused_layers = True
            model._fused_hidden = lambda *a: pytest.fail("the fused layers ran")
        cache = KVCache(num_layers=config.num_layers, num_slots=1, max_seq_len=32, num_kv_heads=config.num_kv_heads,
                        head_dim=config.head_dim, dtype=torch.float32, device="cpu")
        slot = cache.allocate()
        cache.append(slot, list(range(3, 15)))
        batch = RaggedBatch.build([SequenceChunk(slot=slot, start=0, tokens=list(range(3, 15)), logit_rows=12)], "cpu")
        hidden[fold] = model.hidden(batch, cache, fused=False)
    torch.testing.assert_close(hidden[True], hidden[False], rtol=1e-4, atol=1e-4)


def test_the_fused_layers_are_kept_unless_the_folded_ones_time_clearly_faster():
    from bass.engine.graphs import LAYER_PATH_MARGIN, LayerPathTiming

    assert LayerPathTiming(16, 1, 1, fused_us=2000.0, folded_us=2000.0).fused
    assert LayerPathTiming(16, 1, 1, fused_us=2000.0, folded_us=2000.0 * (1 - LAYER_PATH_MARGIN / 2)).fused
    assert not LayerPathTiming(16, 1, 1, fused_us=2000.0, folded_us=2000.0 * (1 - 2 * LAYER_PATH_MARGIN)).fused
    assert LayerPathTiming(16, 1, 1, fused_us=1800.0, folded_us=2000.0).fused
