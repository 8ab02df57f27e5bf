"""The draft's one-launch forward (kernels/triton_megakernel.py) against Transformer.hidden's
existing path. On the CPU it runs in its stage mode (one launch per stage and layer: Triton's
interpreter runs programs one after another, so a grid barrier would never return), which
computes what the persistent launch computes; on a GPU the persistent launch itself."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.config import RunnerConfig  # noqa: E402
from bass.engine.batch import RaggedBatch, SequenceChunk  # noqa: E402
from bass.engine.kv_cache import KVCache  # noqa: E402
from bass.engine.model import LayerWeights, Transformer, TransformerConfig, TransformerWeights  # noqa: E402
from bass.kernels.triton_megakernel import MAX_ROWS, DraftMegakernel, MegaPlan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# (architecture, hidden, intermediate, heads, kv heads, head_dim, q|k|v bias): Qwen2-shaped
# (biases, GQA), Llama-shaped (no bias; multi-head; a hidden size that is not heads x head_dim
# nor a multiple of the inner block, an intermediate size that is not a multiple either).
SHAPES = {
    "qwen2": ("Qwen2ForCausalLM", 64, 128, 4, 2, 16, True),
    "llama": ("LlamaForCausalLM", 80, 96, 4, 4, 16, False),
    "gqa7": ("Qwen2ForCausalLM", 64, 160, 7, 1, 32, True),
}
VOCAB, MAX_LEN, SLOTS = 60, 160, 20


def random_model(shape: str, dtype: torch.dtype, seed: int, *, layers: int = 2, device: str = DEVICE) -> Transformer:
    arch, hidden, inter, heads, kv, head_dim, bias = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.1):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    q, k = heads * head_dim, kv * head_dim
    config = TransformerConfig(architecture=arch, vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter,
                               num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                               rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False,
                               max_position_embeddings=MAX_LEN)
    weights = TransformerWeights(
        embed=w(VOCAB, hidden, scale=1.0), final_norm=1 + w(hidden), lm_head=w(VOCAB, hidden),
        layers=[LayerWeights(input_norm=1 + w(hidden), qkv=w(q + 2 * k, hidden), qkv_bias=w(q + 2 * k) if bias else None,
                             o=w(hidden, q), o_bias=None, post_norm=1 + w(hidden), gate_up=w(2 * inter, hidden),
                             down=w(hidden, inter)) for _ in range(layers)])
    return Transformer(config, weights, max_seq_len=MAX_LEN, attention="triton", int8_weights=True)


def attach(model: Transformer) -> DraftMegakernel:
    """What wiring the megakernel into Transformer.hidden would do (the engine does not: it is
    slower on an H100; see the kernel's docstring): one-token batches of <= MAX_ROWS sequences
    go to it, every other batch keeps the existing path."""
    mk = DraftMegakernel(model)
    existing = model.hidden

    @torch.inference_mode()
    def hidden(batch, cache):
        return mk(batch, cache) if mk.applies(batch, cache) else existing(batch, cache)

    model.hidden = hidden
    return mk


def random_cache(model: Transformer, seed: int) -> KVCache:
    c = model.config
    cache = KVCache(num_layers=c.num_layers, num_slots=SLOTS, max_seq_len=MAX_LEN, num_kv_heads=c.num_kv_heads,
                    head_dim=c.head_dim, dtype=model.dtype, device=model.device)
    gen = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache


def one_token_batch(contexts: list[int], seed: int, padding: int = 0) -> RaggedBatch:
    """A token per sequence at position context - 1 of distinct slots, then `padding` rows as
    the CUDA graphs pad a bucket: token 0 at position 0 of one shared scratch slot."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(SLOTS - 1, generator=gen)[:len(contexts)].tolist()
    chunks = [SequenceChunk(slot=s, start=n - 1, tokens=[int(torch.randint(0, VOCAB, (1,), generator=gen))],
                            logit_rows=1) for s, n in zip(slots, contexts)]
    chunks += [SequenceChunk(slot=SLOTS - 1, start=0, tokens=[0], logit_rows=1)] * padding
    return RaggedBatch.build(chunks, DEVICE)


def compare(model: Transformer, mk: DraftMegakernel, batch: RaggedBatch, cache: KVCache, **call) -> None:
    """The megakernel's hidden rows and the keys / values it writes against the existing path's."""
    saved = cache.k.clone(), cache.v.clone()
    want = model.hidden(batch, cache)
    want_k, want_v = cache.k.clone(), cache.v.clone()
    cache.k.copy_(saved[0])
    cache.v.copy_(saved[1])
    out = mk(batch, cache, **call)
    # On a GPU the int8 products read their activations in bf16 (the tensor cores), fp32 models too:
    # where two fp32 sums differ in their last bit, a bf16 rounding can differ by one step.
    exact = model.dtype == torch.float32 and DEVICE == "cpu"
    tol = dict(atol=1e-5, rtol=1e-5) if exact else dict(atol=3e-2, rtol=2e-2)
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, **tol)
    torch.testing.assert_close(cache.k, want_k, **tol)
    torch.testing.assert_close(cache.v, want_v, **tol)
    if not exact:
        assert float((out.float() - want.float()).norm() / want.float().norm()) < 1e-2
    assert int(mk.counters.count_nonzero()) == 0  # every arrival counter left zeroed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("contexts,padding,programs", [
    ([37], 0, 8),  # one row: the context split over programs, merged by the last split
    ([5, 1, 150, 64, 65], 0, 8),  # ragged, a 1-token context, whole and partial tiles
    ([90, 7, 130], 2, 13),  # padded rows sharing the scratch slot; an odd grid
    ([3 + 9 * i for i in range(MAX_ROWS)], 0, 3),  # 16 rows on 3 programs: no split, loops over units
])
def test_stage_mode_computes_the_existing_forward(shape, dtype, contexts, padding, programs):
    seed = hash((shape, str(dtype), len(contexts), programs)) % 1000
    model = random_model(shape, dtype, seed)
    mk = DraftMegakernel(model, programs=programs)
    compare(model, mk, one_token_batch(contexts, seed, padding), random_cache(model, seed), stage_mode=True)


@pytest.mark.parametrize("o_splits,dn_splits", [(1, 1), (2, 3), (4, 6)])
def test_every_split_of_the_residual_products(o_splits, dn_splits):
    """K split over programs (the last to arrive sums in order and adds the residual), or not;
    16-wide inner blocks, so that the tiny products split (and K = 80 and 96 end mid-run)."""
    model = random_model("llama", torch.float32, 7)
    mk = DraftMegakernel(model, plan=MegaPlan.build(model.config, 8, o_splits=o_splits, dn_splits=dn_splits,
                                                    block_k=16))
    assert (mk.plan.o_splits, mk.plan.dn_splits) == (o_splits, dn_splits)
    compare(model, mk, one_token_batch([40, 2, 77], 8), random_cache(model, 9), stage_mode=True)


def test_one_token_steps_go_to_it_and_the_weights_it_moved_still_serve_the_existing_path():
    """Building it moves the model's int8 codes into one buffer (views, no copy left behind): the
    existing path reads the same weights after. Attached, one-token batches of <= MAX_ROWS
    sequences go to the megakernel; several tokens a sequence, or more rows, keep the existing
    path."""
    model = random_model("qwen2", torch.float32, 11)
    reference = random_model("qwen2", torch.float32, 11)
    batches = (one_token_batch([20, 33], 1),
               RaggedBatch.build([SequenceChunk(slot=0, start=4, tokens=[1, 2], logit_rows=1)], DEVICE),
               one_token_batch([9] * (MAX_ROWS + 1), 2))
    before = [model.hidden(b, random_cache(model, 3)) for b in batches]
    mk = attach(model)
    layer = model.weights.layers[1]
    assert layer.gate_up.q.data_ptr() == mk.wq[1].data_ptr() + mk.offsets[2]
    assert layer.down.scale.data_ptr() == mk.ws[1].data_ptr() + 4 * mk.col_offsets[3]
    calls = []
    original = mk.__call__
    mk.__class__ = type("Counting", (DraftMegakernel,), {"__call__": lambda self, *a, **k: calls.append(1)
                                                          or original(*a, **k)})
    for batch, was in zip(batches, before):
        got = model.hidden(batch, random_cache(model, 3))
        torch.testing.assert_close(got, reference.hidden(batch, random_cache(reference, 3)), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, was, atol=1e-5, rtol=1e-5)
    assert len(calls) == 1
    existing = model.weights.layers[0].qkv
    assert torch.equal(existing.dequantized(), reference.weights.layers[0].qkv.dequantized())


def test_a_draft_runner_with_the_megakernel_proposes_what_it_proposes_without(llama_draft):
    """Greedy and sampled draft tokens through the draft loop, megakernel on and off (CPU:
    stage mode, fp32)."""
    from test_draft_loop import run_rounds

    from bass.config import SamplingParams
    from bass.draft_service.worker import DraftWorker
    from bass.engine.draft_loop import DraftLoopGraphs
    from bass.engine.runner import ModelRunner
    from bass.worker_api import SequenceSampling

    def worker(megakernel: bool) -> DraftWorker:
        runner = ModelRunner(RunnerConfig(model_dir=llama_draft, device=DEVICE, num_slots=8, max_seq_len=64,
                                          attention="triton", int8_weights=True))
        if megakernel:
            attach(runner.model)
        w = DraftWorker(runner, top_n=8)
        if DEVICE == "cuda":  # the loop's CUDA graphs capture the megakernel
            w.warm_up()
            return w
        w.loop = DraftLoopGraphs(runner.model, runner.cache, runner.cache.allocate(), w.sample, capture_graphs=False)
        w.loop.prepare(max_batch=8)
        return w

    samplings = [SequenceSampling(p, seed_key=500 + i) for i, p in
                 enumerate([SamplingParams(), SamplingParams(temperature=0.9, top_p=0.9), SamplingParams()])]
    ks = [4, 2, 5]
    with_mk = run_rounds(worker(True), samplings, ks, [])
    without = run_rounds(worker(False), samplings, ks, [])
    assert with_mk == without


# -- on a GPU: the persistent launch ---------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_persistent_launch_computes_the_existing_forward_and_its_stage_mode(shape, dtype, rows):
    seed = rows * 31 + len(shape)
    model = random_model(shape, dtype, seed)
    mk = DraftMegakernel(model)
    contexts = [1 + (17 * i + seed) % (MAX_LEN - 1) for i in range(rows - rows // 4)]
    batch = one_token_batch(contexts, seed, padding=rows // 4)
    cache = random_cache(model, seed)
    compare(model, mk, batch, cache)
    saved = cache.k.clone(), cache.v.clone()
    persistent = mk(batch, cache).clone()
    assert torch.equal(mk(batch, cache), persistent)  # ordered sums: bit for bit
    cache.k.copy_(saved[0])
    cache.v.copy_(saved[1])
    assert torch.equal(mk(batch, cache, stage_mode=True), persistent)  # a barrier missing would show here
    assert mk.error_flag() == 0 and int(mk.counters.count_nonzero()) == 0


@gpu
@pytest.mark.gpu
def test_persistent_launch_replays_in_a_cuda_graph():
    from bass.engine.graphs import capture

    model = random_model("qwen2", torch.bfloat16, 5)
    mk = DraftMegakernel(model)
    cache = random_cache(model, 5)
    batch = one_token_batch([30, 100, 3, 64], 6)
    eager = mk(batch, cache).clone()
    graph, out = capture(torch.cuda.graph_pool_handle(), lambda: mk(batch, cache), lambda: mk(batch, cache))
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert mk.error_flag() == 0 and int(mk.counters.count_nonzero()) == 0
