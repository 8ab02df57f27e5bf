"""CUDA graphs for uniform decode steps: every sequence runs the same number of tokens.

A decode step of a small model is bound by launching ~1,500 kernels from Python, not by the
GPU. A step in which every sequence runs q tokens (q = 1 for draft steps, q = k + 1 for
verification under a batch-level draft length) has fixed shapes once the batch is padded to a
size bucket, so it can be captured once and replayed with new inputs copied into static
buffers. Padding sequences compute into a scratch KV slot and their rows are dropped.

Attention must be shape-stable for this: the Triton kernel reads each sequence's context
length from device memory, so one capture serves every context length (it is launched with a
single key split sized for the whole cache).

Graphs are captured when the worker warms up, for every batch bucket and the step shapes the
worker will run (`precapture`), and only those replay: a capture costs tens of milliseconds,
and one taken in the middle of serving would show up as a slow step (and mislead the
draft-length policy, which times steps). The LM head runs after the replay, outside the graph, so a graph's static output
is [rows, hidden], not [rows, vocab]: a hundred graphs then cost megabytes, not gigabytes.

A worker may also give a *tail*: a function of a graph's hidden output and a staged vector of
host values (the target's sampled verification, engine/verify_tail.py), captured as a second
graph per shape in the same memory pool. Its [rows, vocab] temporaries are freed at the end of
each capture, so every tail reuses the same blocks; only its small outputs stay.

A model with fused layers can run a step of 9-16 tokens two ways (Transformer.layer_paths), and
which is faster depends on the model and the GPU: both are captured, timed over a few replays
and the faster kept (~0.1 s a shape at warm-up), so a choice measured on one machine is not
assumed on another. The two round differently, like cuBLAS's choice of kernel by shape.
"""

from __future__ import annotations

import functools
import gc
import logging
import statistics
from dataclasses import dataclass, replace
from typing import Callable, Protocol

import numpy as np

import torch

from bass.engine.kv_cache import KVCache
from bass.engine.transfer import Staging
from bass.kernels.batch import RaggedBatch, SequenceChunk
from bass.kernels.timing import replay_us

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MAX_GRAPH_Q = 33  # up to 32 draft tokens + 1


# The vectors of a captured step's batch that each fill rewrites, in the staging buffer's order.
_STEP_VECTORS = ("input_ids", "positions", "token_slots", "slots", "ctx_lens")


class StaticInputs:
    """The device buffers a captured forward reads: a batch of `bucket` sequences x q tokens
    (`rows` logit rows each) whose lengths are bounds (one capture serves every context length).
    The five vectors a step changes (input ids, positions, token slots, slots, context lengths)
    are views into a pinned staging buffer's device twin, so a fill is one host-to-device copy
    and nothing after it (five device copies into separate buffers cost a launch each, on the
    host and on the GPU, before every replay). Each view starts on a 16-byte boundary, as a
    buffer of its own would: Triton specializes its kernels on that."""

    def __init__(self, bucket: int, q: int, rows: int, scratch_slot: int, max_len: int, device: torch.device):
        self.bucket, self.q, self.scratch_slot = bucket, q, scratch_slot
        chunks = [SequenceChunk(slot=scratch_slot, start=0, tokens=[0] * q, logit_rows=rows)] * bucket
        batch = RaggedBatch.build(chunks, device)
        tokens = bucket * q
        sizes = [tokens, tokens, tokens, bucket, bucket]  # per _STEP_VECTORS
        self._segments = [n + n % 2 for n in sizes]  # int64 elements, padded to 16 bytes
        self.staging = Staging(sum(self._segments), torch.int64, device)
        views, start = {}, 0
        for name, n, segment in zip(_STEP_VECTORS, sizes, self._segments):
            views[name] = self.staging.device[start:start + n]
            views[name].copy_(getattr(batch, name))  # the padding batch, until the first fill
            start += segment
        # One capture serves all context lengths: size the attention plan for the whole cache.
        self.batch = replace(batch, max_ctx=max_len, ctx_lens_list=[max_len] * bucket, ctx_lens_are_bounds=True,
                             **views)

    def fill(self, chunks: list[SequenceChunk]) -> None:
        """Copy a step's inputs into the buffers (one host-to-device copy); sequences past
        len(chunks) are padding that computes into the scratch slot."""
        bucket, q = self.bucket, self.q
        ids, pos, tslots, slots, ctx = [], [], [], [], []
        for c in chunks:
            ids += c.tokens
            pos += range(c.start, c.start + q)
            tslots += [c.slot] * q
            slots.append(c.slot)
            ctx.append(c.start + q)
        pad = bucket - len(chunks)
        ids += [0] * (pad * q)
        pos += list(range(q)) * pad
        tslots += [self.scratch_slot] * (pad * q)
        slots += [self.scratch_slot] * pad
        ctx += [q] * pad
        staged = []
        for column, segment in zip((ids, pos, tslots, slots, ctx), self._segments):
            staged += column + [0] * (segment - len(column))
        self.staging.load(torch.tensor(staged, dtype=torch.int64))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: StaticInputs
    hidden: torch.Tensor | None  # static output: final hidden states of the logit rows


class GraphTail(Protocol):
    """Work that follows a forward, captured per shape: outputs = tail(hidden, input_ids,
    staged, bucket, rows), with the forward's input tokens [bucket * q] and staged a float64
    vector of width(bucket, rows) host values (blank: padding)."""

    def width(self, bucket: int, rows: int) -> int: ...
    def blank(self, bucket: int, rows: int) -> np.ndarray: ...
    def __call__(self, hidden: torch.Tensor, input_ids: torch.Tensor, staged: torch.Tensor, bucket: int,
                 rows: int) -> tuple[torch.Tensor, ...]: ...


class _TailGraph:
    """A captured tail and its staged input, copied to the device once per replay."""

    def __init__(self, width: int, device: torch.device):
        self.staging = Staging(width, torch.float64, device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()


def capture(pool, warm_up: Callable[[], object], body: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """A CUDA graph of `body` in `pool`, and body's output (its static result). warm_up runs
    twice first, on a side stream (Triton compilation, the allocator's first blocks); it must
    make the same writes as body, e.g. body itself."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            warm_up()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No garbage collection while capturing: torch.cuda.graph collects once on entry, but an
    # allocation inside the capture (Triton's scratch, say) can trigger another, and freeing an
    # unreachable CUDA graph (a failed request's, a test's) mid-capture aborts the process.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = body()
    finally:
        if collecting:
            gc.enable()
    return graph, out


LAYER_PATH_MARGIN = 0.02  # timing noise between two graphs of one process is ~1%
_PATH_REPLAYS, _PATH_ROUNDS = 10, 3  # replays a timing, timings a path (the median): ~0.1 s a step of a 1.5B


@dataclass(frozen=True)
class LayerPathTiming:
    """A captured step's two layer paths as timed at capture (µs a replay), and the one kept."""

    bucket: int
    q: int
    rows: int
    fused_us: float
    folded_us: float

    @property
    def fused(self) -> bool:
        return self.folded_us >= (1 - LAYER_PATH_MARGIN) * self.fused_us


class DecodeGraphs:
    def __init__(self, model, cache: KVCache, scratch_slot: int):
        self.model, self.cache, self.scratch_slot = model, cache, scratch_slot
        self.device = model.device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.tails: dict[tuple[int, int, int], _TailGraph] = {}
        self.layer_path_timings: list[LayerPathTiming] = []  # what _capture timed (benchmarks report it)

    @staticmethod
    def bucket(num_seqs: int) -> int | None:
        return next((b for b in BATCH_BUCKETS if b >= num_seqs), None)

    def eligible(self, chunks: list[SequenceChunk]) -> bool:
        """A uniform step whose shape was captured at warm-up. Other shapes (prefill, drafts
        longer than graph_max_draft) run eagerly: capturing them on the fly would stall
        serving and, with prompt lengths unbounded, keep adding graphs."""
        q, rows = len(chunks[0].tokens), chunks[0].logit_rows
        return ((self.bucket(len(chunks)), q, rows) in self.graphs
                and all(len(c.tokens) == q and c.logit_rows == rows for c in chunks))

    def run(self, chunks: list[SequenceChunk], fed: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits for an eligible batch ([len(chunks) * logit_rows, vocab]). fed, device
        int64 [len(chunks), m], replaces the last m tokens of every chunk's list."""
        return self.model.logits(self._replay(chunks, fed))

    def has_tail(self, chunks: list[SequenceChunk]) -> bool:
        return self.eligible(chunks) and self._key(chunks) in self.tails

    def run_tail(self, chunks: list[SequenceChunk], staged: np.ndarray,
                 fed: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The forward of `run` and then its shape's tail on `staged` (made for the bucket):
        the tail's static outputs, overwritten by the next replay of this shape (keep copies
        of what must last)."""
        tail = self.tails[self._key(chunks)]
        self._replay(chunks, fed)
        tail.staging.load(torch.from_numpy(staged))
        tail.graph.replay()
        return tail.outputs

    def _key(self, chunks: list[SequenceChunk]) -> tuple[int, int, int]:
        return self.bucket(len(chunks)), len(chunks[0].tokens), chunks[0].logit_rows

    def _replay(self, chunks: list[SequenceChunk], fed: torch.Tensor | None) -> torch.Tensor:
        num, q, rows = len(chunks), len(chunks[0].tokens), chunks[0].logit_rows
        graph = self.graphs[self._key(chunks)]
        graph.inputs.fill(chunks)
        if fed is not None:
            graph.inputs.batch.input_ids.view(graph.inputs.bucket, q)[:num, q - fed.shape[1]:].copy_(fed)
        graph.graph.replay()
        return graph.hidden[:num * rows]

    def precapture(self, shapes: list[tuple[int, int]], max_batch: int, tail: GraphTail | None = None) -> None:
        """Capture graphs for every batch bucket up to max_batch's and each (tokens per
        sequence, logit rows per sequence) in `shapes`, each followed by a graph of `tail`."""
        last = self.bucket(max_batch) or BATCH_BUCKETS[-1]
        for bucket in (b for b in BATCH_BUCKETS if b <= last):
            for q, rows in shapes:
                key = (bucket, q, rows)
                if q <= MAX_GRAPH_Q and key not in self.graphs:
                    self.graphs[key] = self._capture(*key)
                if tail is not None and key in self.graphs and key not in self.tails:
                    self.tails[key] = self._capture_tail(tail, key)
        log.info("%d CUDA graphs captured (batch buckets up to %d), %d tails", len(self.graphs), last, len(self.tails))

    # -- internals -----------------------------------------------------------------------------
    def _capture(self, bucket: int, q: int, rows: int) -> _Graph:
        """Record one forward of a padding batch (every sequence in the scratch slot); later
        replays read whatever `fill` copied into the same buffers. Where the model has two
        layer paths for the step (Transformer.layer_paths), each is captured and timed over a
        few replays, and the fused one is kept unless the other is faster by LAYER_PATH_MARGIN."""
        inputs = StaticInputs(bucket, q, rows, self.scratch_slot, self.cache.max_seq_len, self.device)
        paths = self.model.layer_paths(bucket * q)
        graphs = {}
        for fused in paths:
            forward = functools.partial(self.model.hidden, inputs.batch, self.cache, fused=fused)
            graph, hidden = capture(self.pool, forward, forward)
            graphs[fused] = _Graph(graph=graph, inputs=inputs, hidden=hidden)
        if len(graphs) == 1:
            return graphs[paths[0]]
        times = {True: [], False: []}
        for _ in range(_PATH_ROUNDS):  # alternated, so that a clock ramping up favours neither
            for fused, graph in graphs.items():
                times[fused].append(replay_us(graph.graph, _PATH_REPLAYS, rounds=1))
        timing = LayerPathTiming(bucket, q, rows, statistics.median(times[True]), statistics.median(times[False]))
        self.layer_path_timings.append(timing)
        log.info("%d x %d tokens: fused layers %.1f µs, folded %.1f µs: %s", bucket, q, timing.fused_us,
                 timing.folded_us, "fused" if timing.fused else "folded")
        return graphs[timing.fused]  # the other graph and its memory go back to the pool

    def _capture_tail(self, tail: GraphTail, key: tuple[int, int, int]) -> _TailGraph:
        bucket, _, rows = key
        out = _TailGraph(tail.width(bucket, rows), self.device)
        staged = out.staging.load(torch.from_numpy(tail.blank(bucket, rows)))
        graph = self.graphs[key]
        body = functools.partial(tail, graph.hidden, graph.inputs.batch.input_ids, staged, bucket, rows)
        out.graph, out.outputs = capture(self.pool, body, body)
        return out
