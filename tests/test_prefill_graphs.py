"""Prefill from CUDA graphs (engine/prefill_graphs.py): a token bucket's static batch, holding
a prefill's prompts, a padding sequence and empty entries, writes the cache a plain batch of the
same prompts writes, and touches no other slot. On the CPU the static batch runs eagerly
(Triton's interpreter for the attention kernel, as in the graphs); the graphs themselves on a
GPU."""

from __future__ import annotations

import pytest
import torch

from bass.engine.kv_cache import KVCache
from bass.engine.model import Transformer
from bass.engine.prefill_graphs import MAX_SEQS, PrefillGraphs, RaggedInputs
from bass.engine.weights import load_config, load_weights
from bass.kernels.batch import RaggedBatch, SequenceChunk

MAX_LEN = 128
# The static batch runs eagerly here: on the CPU through Triton's interpreter, on a GPU compiled.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _model_and_caches(model_dir, device: str, n: int = 2):
    config = load_config(model_dir)
    weights = load_weights(model_dir, config, dtype="float32", device=device)
    model = Transformer(config, weights, max_seq_len=MAX_LEN, attention="triton")
    caches = [KVCache(num_layers=config.num_layers, num_slots=6, max_seq_len=MAX_LEN, num_kv_heads=config.num_kv_heads,
                      head_dim=config.head_dim, dtype=torch.float32, device=device) for _ in range(n)]
    scratch = {cache.allocate() for cache in caches}  # slot 0 in each, so prompts get the same slots
    return model, caches, scratch.pop()


def _prompts(caches, lengths, starts=None, seed=0):
    """The same chunks staged in every cache (slots 0.. in order); prompts of random tokens."""
    gen = torch.Generator().manual_seed(seed)
    chunks = []
    for i, n in enumerate(lengths):
        start = 0 if starts is None else starts[i]
        tokens = torch.randint(1, 200, (n,), generator=gen).tolist()
        for cache in caches:
            slot = cache.allocate()
            cache.append(slot, [0] * start + tokens)
        chunks.append(SequenceChunk(slot=slot, start=start, tokens=tokens, logit_rows=0))
    return chunks


@pytest.mark.parametrize("lengths", [[5, 17, 9], [64], [1, 30]])
def test_a_buckets_static_batch_writes_the_cache_a_plain_batch_writes(qwen_target, lengths):
    model, (plain, padded), scratch = _model_and_caches(qwen_target, DEVICE)
    chunks = _prompts([plain, padded], lengths)
    model.hidden(RaggedBatch.build(chunks, DEVICE), plain)
    inputs = RaggedInputs(64, 4, scratch, MAX_LEN, torch.device(DEVICE))
    assert inputs.fits(chunks)
    inputs.fill(chunks)
    model.hidden(inputs.batch, padded)
    for c in chunks:
        end = c.start + len(c.tokens)
        for layer in range(len(plain.k)):
            torch.testing.assert_close(padded.k[layer][c.slot, :end], plain.k[layer][c.slot, :end], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(padded.v[layer][c.slot, :end], plain.v[layer][c.slot, :end], rtol=1e-4, atol=1e-5)
    untouched = [s for s in range(6) if s not in {c.slot for c in chunks} | {scratch}]
    assert untouched
    for layer in range(len(padded.k)):
        assert not padded.k[layer][untouched].any() and not padded.v[layer][untouched].any()
    # The padding sequence took the bucket's remaining tokens, into the scratch slot; the
    # other entries are empty.
    n = len(lengths)
    assert inputs.batch.slots.tolist() == [c.slot for c in chunks] + [scratch] * (5 - n)
    assert inputs.batch.q_lens.tolist() == lengths + [64 - sum(lengths)] + [0] * (4 - n)
    assert inputs.batch.token_slots[sum(lengths):].eq(scratch).all()


def test_a_refill_replaces_the_last_prefill_and_prompts_past_position_zero_attend_to_their_prefix(qwen_target):
    """Buffers filled twice (as one graph serves prefill after prefill): the second fill's
    fewer tokens leave none of the first behind; a chunk that starts past 0 (a prompt whose
    first tokens are cached, e.g. a budgeted prefill's second part) reads its prefix."""
    model, (plain, padded), scratch = _model_and_caches(qwen_target, DEVICE)
    inputs = RaggedInputs(64, 4, scratch, MAX_LEN, torch.device(DEVICE))
    inputs.fill(_prompts([plain, padded], [20, 20, 20], seed=1))
    model.hidden(inputs.batch, padded)
    # The prefix of the second prefill's chunks, run the same way into both caches first.
    prefix = _prompts([plain, padded], [7, 3], seed=2)
    model.hidden(RaggedBatch.build(prefix, DEVICE), plain)
    model.hidden(RaggedBatch.build(prefix, DEVICE), padded)
    rest = [SequenceChunk(slot=c.slot, start=len(c.tokens), tokens=[11, 12, 13, 14][: 2 + i], logit_rows=0)
            for i, c in enumerate(prefix)]
    for cache in (plain, padded):
        for c in rest:
            cache.append(c.slot, c.tokens)
    model.hidden(RaggedBatch.build(rest, DEVICE), plain)
    inputs.fill(rest)
    assert inputs.batch.q_lens.tolist() == [2, 3, 59, 0, 0]
    assert inputs.batch.ctx_lens.tolist() == [9, 6, 59, 0, 0]
    model.hidden(inputs.batch, padded)
    for c in rest:
        end = c.start + len(c.tokens)
        torch.testing.assert_close(padded.k[1][c.slot, :end], plain.k[1][c.slot, :end], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(padded.v[1][c.slot, :end], plain.v[1][c.slot, :end], rtol=1e-4, atol=1e-5)


def test_only_prefills_that_fit_a_captured_bucket_take_a_graph():
    graphs = PrefillGraphs(model=None, cache=None, scratch_slot=0, pool=None)
    graphs.graphs = {64: None, 256: None}

    def chunks(*lengths, rows=0):
        return [SequenceChunk(slot=i, start=0, tokens=[1] * n, logit_rows=rows) for i, n in enumerate(lengths)]

    assert graphs.bucket(chunks(10, 20)) == 64
    assert graphs.bucket(chunks(64)) == 64
    assert graphs.bucket(chunks(60, 5)) == 256
    assert graphs.bucket(chunks(200, 57)) is None  # more tokens than the largest bucket
    assert graphs.bucket(chunks(*[1] * (MAX_SEQS + 1))) is None  # more prompts than a graph's entries
    assert graphs.bucket(chunks(10, rows=1)) is None  # steps that want logits run elsewhere


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_prefill_from_graphs_leaves_the_cache_and_the_next_logits_of_an_eager_prefill(qwen_target):
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    config = RunnerConfig(model_dir=qwen_target, device="cuda", dtype="float32", num_slots=8, max_seq_len=256,
                          attention="triton")
    runners = [ModelRunner(config), ModelRunner(config)]
    for r in runners:
        r.warm_up(graph_shapes=[(1, 1)])
    graphed, eager = runners
    assert sorted(graphed.prefill_graphs.graphs) == [64, 128, 256]
    eager.prefill_graphs = None
    prompts = [list(range(3, 3 + n)) for n in (5, 40, 77)]
    logits = []
    for r in runners:
        with torch.inference_mode():  # as the workers call the runner
            r.add([AddSequence(seq_id=i, prompt_ids=tuple(p)) for i, p in enumerate(prompts)])
            states = [r.get(i) for i in range(len(prompts))]
            logits.append(r.forward([(s, []) for s in states], logits_per_seq=[1] * len(states)))
    for a, b in zip(graphed.cache.k, eager.cache.k):
        for i in range(len(prompts)):
            slot = graphed.get(i).slot
            torch.testing.assert_close(a[slot, :len(prompts[i])], b[eager.get(i).slot, :len(prompts[i])],
                                       rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
