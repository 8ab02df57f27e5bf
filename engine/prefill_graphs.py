"""CUDA graphs for prefill: new prompts (all but their last token) padded to a token bucket.

Why: an eager forward is bound by launching its ~300 kernels from Python, ~9-10 ms of host time
on the GPU machine against ~2 ms replayed from a graph (bench/results,
2026-11-27-h200x4-final/forward-kernels.json: the 1.5B target 9.2 against 2.0 ms, the 0.5B
draft 9.8 against 1.1). Decode steps replay graphs (engine/graphs.py), but a prompt's prefill,
whose shape is ragged, ran eagerly in both models at a batch's first step: on an H100 the first
commit of a 128-token round came 18-50 ms after the batch arrived, against 2-5 ms a step after
it, 10-20% of the round at 1-8 sequences (2026-11-27-h100-readme-table-ab03515, `--trace`).

One graph per token bucket serves any split of up to its tokens into up to MAX_SEQS sequences,
so prompts of any lengths replay it. Its static batch has MAX_SEQS + 1 sequence entries: the
real sequences, then a padding sequence that takes the bucket's remaining tokens into the
scratch slot (positions 0..), then empty entries (no query tokens: the attention kernel's
programs for them exit at once). Host-side lengths are bounds, as in the decode graphs: the
attention plan is made for every entry holding a whole bucket.

Prefill asks for no logits (the prompt's last token runs with the first step), so the graph's
output is the KV cache alone. Rows are independent in every kernel but attention, which reads
only its own sequence's keys, so padding changes no real row's values; the products run on a
bucket's rows instead of the prompt's, which may round them differently than an eager forward
of the same prompt would (as any change of batch does outside the batch-invariant mode, which
runs without these graphs).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from bass.engine.graphs import capture
from bass.engine.kv_cache import KVCache
from bass.engine.transfer import Staging
from bass.kernels.batch import RaggedBatch, SequenceChunk

log = logging.getLogger(__name__)

# Bigger prefills run eagerly: there the GPU's time outgrows the launches' (the 1.5B's prefill of
# 8 prompts, ~800 tokens, took 10 ms of GPU time on an H100, of 64 prompts 31 ms: bench/results,
# 2026-11-25-late-pace) and a bucket's padding would cost more than a graph saves. Steps of 1.5x
# past 512 keep that padding under a third.
TOKEN_BUCKETS = (64, 128, 256, 512, 768, 1024, 1536, 2048)
MAX_SEQS = 16  # prompts one prefill graph takes (a batch's first wave at up to 16 sequences)


class RaggedInputs:
    """The device buffers of a prefill graph: up to `max_seqs` sequences of `tokens` tokens in
    all, plus the padding sequence, and a pinned staging buffer that fills them with one
    host-to-device copy. Built holding only the padding sequence (what the capture runs)."""

    def __init__(self, tokens: int, max_seqs: int, scratch_slot: int, max_len: int, device: torch.device):
        self.tokens, self.max_seqs, self.scratch_slot = tokens, max_seqs, scratch_slot
        entries = max_seqs + 1

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        self.batch = RaggedBatch(
            input_ids=zeros(tokens), positions=zeros(tokens), token_slots=zeros(tokens), token_seq=zeros(tokens),
            token_offset=zeros(tokens), slots=zeros(entries), q_starts=zeros(entries + 1), q_lens=zeros(entries),
            ctx_lens=zeros(entries), logit_rows=zeros(0), max_q=tokens, max_ctx=max_len,
            q_lens_list=[tokens] * entries, ctx_lens_list=[max_len] * entries, slots_list=[scratch_slot] * entries,
            ctx_lens_are_bounds=True)
        self.staging = Staging(5 * tokens + 4 * entries + 1, torch.int64, device)
        self.fill([])

    def fits(self, chunks: list[SequenceChunk]) -> bool:
        return len(chunks) <= self.max_seqs and sum(len(c.tokens) for c in chunks) <= self.tokens

    def fill(self, chunks: list[SequenceChunk]) -> None:
        """Copy a prefill's chunks into the buffers (one host-to-device copy); the padding
        sequence takes the tokens they leave."""
        def scratch(tokens: int) -> SequenceChunk:
            return SequenceChunk(slot=self.scratch_slot, start=0, tokens=[0] * tokens, logit_rows=0)

        padding = scratch(self.tokens - sum(len(c.tokens) for c in chunks))
        empty = [scratch(0)] * (self.max_seqs - len(chunks))
        columns = RaggedBatch.columns([*chunks, padding, *empty])
        del columns["logit_rows"]  # none
        dev = self.staging.load(torch.tensor([v for column in columns.values() for v in column], dtype=torch.int64))
        at = 0
        for name, column in columns.items():
            getattr(self.batch, name).copy_(dev[at:at + len(column)])
            at += len(column)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: RaggedInputs


class PrefillGraphs:
    """Prefill graphs of one model over its cache, in the decode graphs' memory pool (the two
    never run at once: one stream)."""

    def __init__(self, model, cache: KVCache, scratch_slot: int, pool):
        self.model, self.cache, self.scratch_slot, self.pool = model, cache, scratch_slot, pool
        self.graphs: dict[int, _Graph] = {}

    def bucket(self, chunks: list[SequenceChunk]) -> int | None:
        """The captured token bucket that takes these chunks (None: they run eagerly)."""
        if len(chunks) > MAX_SEQS or any(c.logit_rows for c in chunks):
            return None
        tokens = sum(len(c.tokens) for c in chunks)
        return next((t for t in self.graphs if t >= tokens), None)  # captured smallest first

    def run(self, chunks: list[SequenceChunk]) -> bool:
        """Write the chunks' keys and values into the cache from a graph; False (nothing run)
        where none takes them."""
        bucket = self.bucket(chunks)
        if bucket is None:
            return False
        graph = self.graphs[bucket]
        with torch.inference_mode():  # the buffers were made in the warm-up's inference mode
            graph.inputs.fill(chunks)
            graph.graph.replay()
        return True

    def precapture(self) -> None:
        """Capture a graph for every token bucket the cache's sequences can hold."""
        for tokens in TOKEN_BUCKETS:
            if tokens <= self.cache.max_seq_len and tokens not in self.graphs:
                inputs = RaggedInputs(tokens, MAX_SEQS, self.scratch_slot, self.cache.max_seq_len, self.model.device)
                forward = functools.partial(self.model.hidden, inputs.batch, self.cache)
                graph, _ = capture(self.pool, forward, forward)
                self.graphs[tokens] = _Graph(graph, inputs)
        log.info("%d prefill graphs captured (up to %d tokens, %d prompts)", len(self.graphs),
                 max(self.graphs, default=0), MAX_SEQS)
