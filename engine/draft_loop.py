"""The draft's k forwards as CUDA graphs that feed themselves: no host work between draft tokens.

A draft forward of the small model takes about a millisecond at batch 8 on an H100. Replayed
one graph per forward, each draft token still cost host work in between (the next step's inputs,
the LM head and the sampler launched from Python), and at every call's start the GPU waited
for that host work. Here the LM head and the sampler are inside the graphs, and each graph
writes the next step's inputs itself:

- the *first* graph of a bucket runs every sequence's q0 pending tokens (q0 = 2 or 3: the
  worker rewinds so that every sequence has as many) and samples each sequence's first
  draft token;
- the *next* graph runs one token per sequence, the previous winner, at the next position,
  samples, and advances the positions, context lengths and step index it reads.

A proposal of k tokens is one fill of the inputs, the first graph and k - 1 replays of the next
graph queued back to back; its [batch, k] tokens stay on the device, where the target's
verification reads them, and are copied back once. Graphs are captured per
(batch bucket, q0, sampling mode) and (batch bucket, mode); the mode is "greedy" (argmax) or
"sampled" (the draft's Gumbel race with each row's own temperature, top-k and top-p, read from
buffers the host fills per call, with one noise key per row and step).

Without capture (`capture=False`, the CPU tests) the same step functions run eagerly on the
same buffers, so the inputs-advancing logic is tested without a GPU.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from bass.core.config import MAX_LOOKUP_TAIL, SamplingParams
from bass.engine.graphs import BATCH_BUCKETS, MAX_GRAPH_Q, DecodeGraphs, StaticInputs, capture
from bass.engine.kv_cache import KVCache
from bass.engine.sampling import RowParams
from bass.engine.transfer import Staging
from bass.kernels.batch import SequenceChunk

log = logging.getLogger(__name__)

MAX_STEPS = MAX_GRAPH_Q - 1  # the most draft tokens one proposal takes through the graphs
FIRST_STEP_TOKENS = (2, 3)  # q0: pending tokens per sequence that the first graph runs
CHAINED_FIRST_TOKENS = 2  # q0 of a proposal chained behind a verification (run_chained)...
# ...plus one a lookup token the target verified after the drafts (engine/lookup_tail.py): the
# draft never ran those, and the target may accept them all.
CHAINED_WINDOWS = tuple(CHAINED_FIRST_TOKENS + m for m in range(MAX_LOOKUP_TAIL + 1))
# A chained forward after lookup tokens runs only where the bucket's rows stay within this many:
# past 16 it leaves the draft's fused few-row path (H200, 8 sequences x 4 rows through the
# services: +0.87 ms a step, which 14% fewer steps did not pay back;
# bench/results/2026-11-27-h200-lookup-tail/). Wider windows are not captured there at all.
CHAINED_MAX_ROWS = 16
MODES = ("greedy", "sampled")


def first_windows(bucket: int) -> tuple[int, ...]:
    """The first graph's token counts captured for a batch bucket: a proposal's own (q0 = 2, 3)
    and, within CHAINED_MAX_ROWS, a chained proposal's after lookup tokens."""
    chained = (w for w in CHAINED_WINDOWS if w == CHAINED_FIRST_TOKENS or bucket * w <= CHAINED_MAX_ROWS)
    return tuple(sorted(set(FIRST_STEP_TOKENS) | set(chained)))


def max_lookup_tail(num_seqs: int) -> int:
    """The most lookup tokens a target may append for num_seqs sequences so that the proposal
    chained behind them (which re-runs 2 + that many tokens a sequence) replays a captured graph
    within CHAINED_MAX_ROWS (first_windows captures every such window): 6 at one or two
    sequences, 2 at three or four, none past."""
    bucket = DecodeGraphs.bucket(num_seqs)
    if bucket is None:
        return 0
    return max(0, min(MAX_LOOKUP_TAIL, CHAINED_MAX_ROWS // bucket - CHAINED_FIRST_TOKENS))

# tokens = sample(logits [R, V] fp32, rows, noise keys [R] or None for greedy rows only)
Sampler = Callable[[torch.Tensor, RowParams, "torch.Tensor | None"], torch.Tensor]


class _Buffers:
    """A bucket's device state, shared by its graphs: the one-token batch the next-step graph
    runs (written by the graph before it), the sampling parameters and noise keys the host
    fills per call, the index of the step being sampled, and the tokens drafted so far."""

    def __init__(self, bucket: int, scratch_slot: int, max_len: int, device: torch.device):
        self.bucket = bucket
        step = StaticInputs(bucket, 1, 1, scratch_slot, max_len, device).batch
        self.step = replace(step, token_slots=step.slots)  # one token per sequence: its slot
        # RowParams.columns (floats, ints) and the noise keys: views of what the host stages.
        self.staged_floats = Staging(3 * bucket, torch.float32, device)
        self.staged_ints = Staging(3 * bucket + bucket * MAX_STEPS, torch.int64, device)
        self.floats = self.staged_floats.device.view(3, bucket)
        self.ints = self.staged_ints.device[:3 * bucket].view(3, bucket)
        self.keys = self.staged_ints.device[3 * bucket:].view(bucket, MAX_STEPS)
        self.index = torch.zeros(1, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(bucket, MAX_STEPS, dtype=torch.int64, device=device)

    def fill_sampling(self, params: Sequence[SamplingParams], keys: torch.Tensor) -> None:
        """Per-row parameters (padding rows: greedy) and noise keys [len(params), k] (host)."""
        floats, ints = RowParams.columns(list(params) + [SamplingParams()] * (self.bucket - len(params)))
        all_keys = torch.zeros(self.bucket, MAX_STEPS, dtype=torch.int64)
        all_keys[:keys.shape[0], :keys.shape[1]] = keys
        self.staged_floats.load(torch.tensor(floats, dtype=torch.float32).view(-1))
        self.staged_ints.load(torch.cat([torch.tensor(ints, dtype=torch.int64).view(-1), all_keys.view(-1)]))

    def rows(self, mode: str, vocab: int) -> RowParams:
        if mode == "greedy":
            return RowParams.build([], self.floats.device)
        return RowParams.from_columns(self.floats, self.ints, any_greedy=True, any_truncation=True, max_top_k=vocab)


@dataclass
class _First:
    inputs: StaticInputs
    run: Callable[[], object]


class DraftLoopGraphs:
    def __init__(self, model, cache: KVCache, scratch_slot: int, sample: Sampler, *, pool=None,
                 capture_graphs: bool = True):
        """sample: the draft's rule (tokens from logits, rows, keys); pool: the CUDA graph
        memory pool to share with the runner's other graphs; capture_graphs=False runs the same
        steps eagerly (tests)."""
        self.model, self.cache, self.scratch_slot, self.sample = model, cache, scratch_slot, sample
        self.pool, self.capture_graphs = pool, capture_graphs
        self.buffers: dict[int, _Buffers] = {}
        self.first: dict[tuple[int, int, str], _First] = {}  # (bucket, q0, mode)
        self.next: dict[tuple[int, str], Callable[[], object]] = {}  # (bucket, mode)
        self._last: tuple[int, str] | None = None  # the last run's (bucket, mode), for `extend`
        self._column = 0  # the next token column of the last run

    def eligible(self, num_seqs: int, q0: int, k: int, mode: str) -> bool:
        bucket = DecodeGraphs.bucket(num_seqs)
        return 1 <= k <= MAX_STEPS and (bucket, q0, mode) in self.first and (bucket, mode) in self.next

    def run(self, chunks: list[SequenceChunk], k: int, params: Sequence[SamplingParams] | None = None,
            keys: torch.Tensor | None = None) -> torch.Tensor:
        """k draft tokens for each chunk's sequence, on the device [len(chunks), k] (a view of
        a buffer the next call overwrites): chunks are the first forward's (q0 pending tokens
        each, their cache positions reserved; the caller reserves k - 1 more per sequence for
        the fed tokens). params and keys (host int64 [len(chunks), k]) for the sampled mode;
        None: every row greedy."""
        return self._launch(chunks, k, params, keys)

    def run_chained(self, chunks: list[SequenceChunk], k: int, verdicts: torch.Tensor,
                    params: Sequence[SamplingParams] | None = None,
                    key_window: torch.Tensor | None = None) -> torch.Tensor:
        """`run` for a proposal queued behind a verification whose verdicts the host has not
        read: how many drafts each sequence kept (j) is known only on the device, in `verdicts`
        (engine/verification.verdict_columns: [j, the target's tokens at every row, ...]).

        chunks: w = 2 + t tokens per sequence (t: the lookup tokens the target verified after
        the drafts, its `tail`), [its last w - 1 committed tokens before that verification,
        anything], at their positions: what the first forward would run had nothing been
        accepted. On the device every chunk moves j positions on and takes its tokens from its
        own and the verdicts, [..., the last accepted draft (or the chunk's own token where j =
        0), the target's token]: the sequence's last w committed tokens after the verification.
        The first forward re-runs the tokens the draft already holds (the same keys and values),
        so that it also runs the lookup tokens the target accepted, which the draft never ran.
        key_window (sampled mode, host int64 [len(chunks), w']): the noise keys of the w'
        positions after the chunk's last committed one; draft step m takes column j + m."""
        if len(chunks[0].tokens) not in CHAINED_WINDOWS:
            raise ValueError(f"a chained proposal's first forward runs one of {CHAINED_WINDOWS} tokens per sequence")
        return self._launch(chunks, k, params, key_window, verdicts)

    def _launch(self, chunks: list[SequenceChunk], k: int, params: Sequence[SamplingParams] | None,
                keys: torch.Tensor | None, verdicts: torch.Tensor | None = None) -> torch.Tensor:
        """run's work: stage the first graph's inputs (chained: moved on from the verdicts on
        the device), then replay the first graph and k - 1 next-token ones."""
        if not 1 <= k <= MAX_STEPS:
            raise ValueError(f"the draft loop runs 1..{MAX_STEPS} steps, not {k}")
        num, q0 = len(chunks), len(chunks[0].tokens)
        mode = "greedy" if params is None else "sampled"
        bucket = DecodeGraphs.bucket(num)
        buffers = self.buffers[bucket]
        first = self.first[(bucket, q0, mode)]
        first.inputs.fill(chunks)
        if params is not None:
            buffers.fill_sampling(params, keys)
        if verdicts is not None:
            self._move_on(first.inputs, buffers, verdicts[:num], k if params is not None else 0)
        first.run()
        step = self.next[(bucket, mode)]
        for _ in range(k - 1):
            step()
        self._last, self._column = (bucket, mode), k
        return buffers.tokens[:num, :k]

    def extendable(self, m: int) -> bool:
        """Whether the last run can take m more steps (its token buffer holds MAX_STEPS)."""
        return self._last is not None and self._column + m <= MAX_STEPS

    def extend(self, num: int, m: int) -> torch.Tensor:
        """m more steps of the last run (`extendable`), queued on the device: each runs the last
        token and samples the next, from the buffers the last step left. Returns [num, m + 1]:
        the last run's final token, then the m new ones (a view the next run overwrites)."""
        bucket, mode = self._last
        step = self.next[(bucket, mode)]
        for _ in range(m):
            step()
        start, self._column = self._column, self._column + m
        return self.buffers[bucket].tokens[:num, start - 1:start + m]

    @staticmethod
    def _move_on(inputs: StaticInputs, buffers: _Buffers, verdicts: torch.Tensor, keyed_steps: int) -> None:
        """run_chained's device half: the first forward's tokens, positions and context lengths
        (and the steps' noise keys) from the verdicts, written into the staged buffers."""
        num, width = verdicts.shape[0], inputs.q
        accepted = verdicts[:, :1]  # [num, 1]
        ids = inputs.batch.input_ids.view(inputs.bucket, width)[:num]
        # The chunk's committed tokens, then the verification's token at each row: position by
        # position the sequence's text after the verification, read from `accepted` on.
        text = torch.cat([ids[:, :width - 1], verdicts[:, 1:]], dim=1)
        ids.copy_(text.gather(1, accepted + torch.arange(width, device=text.device)[None, :]))
        inputs.batch.positions.view(inputs.bucket, inputs.q)[:num].add_(accepted)
        inputs.batch.ctx_lens[:num].add_(accepted.view(-1))
        if keyed_steps:
            keys = buffers.keys[:num]
            columns = accepted + torch.arange(keyed_steps, device=keys.device)[None, :]
            keys[:, :keyed_steps].copy_(keys.gather(1, columns))

    def prepare(self, max_batch: int) -> None:
        """Capture (or, without capture, set up) the graphs of every batch bucket up to
        max_batch's, for every q0 and mode."""
        last = DecodeGraphs.bucket(max_batch) or BATCH_BUCKETS[-1]
        device = self.model.device
        for bucket in (b for b in BATCH_BUCKETS if b <= last):
            if bucket not in self.buffers:
                self.buffers[bucket] = _Buffers(bucket, self.scratch_slot, self.cache.max_seq_len, device)
            buffers = self.buffers[bucket]
            for mode in MODES:
                nxt = functools.partial(self._next_step, buffers, mode)
                for q0 in first_windows(bucket):
                    inputs = StaticInputs(bucket, q0, 1, self.scratch_slot, self.cache.max_seq_len, device)
                    first = functools.partial(self._first_step, inputs, buffers, mode)
                    self.first[(bucket, q0, mode)] = _First(inputs, self._compile(first, lambda f=first: (f(), nxt())))
                self.next[(bucket, mode)] = self._compile(nxt, nxt)
        if self.capture_graphs:
            log.info("draft loop: %d CUDA graphs captured (batch buckets up to %d)",
                     len(self.first) + len(self.next), last)

    # -- internals -----------------------------------------------------------------------------
    def _compile(self, body: Callable[[], object], warm_up: Callable[[], object]) -> Callable[[], object]:
        if not self.capture_graphs:
            return body
        graph, _ = capture(self.pool, warm_up, body)
        return graph.replay

    def _draw(self, hidden: torch.Tensor, buffers: _Buffers, mode: str, step: torch.Tensor | int) -> torch.Tensor:
        """The winners [bucket] of the rows' final hidden states at draft step `step` (an int,
        or the device index [bucket, 1] of the step for each row)."""
        logits = self.model.logits(hidden)
        keys = None
        if mode == "sampled":
            keys = buffers.keys[:, step] if isinstance(step, int) else buffers.keys.gather(1, step).squeeze(1)
        return self.sample(logits, buffers.rows(mode, logits.shape[-1]), keys)

    def _first_step(self, inputs: StaticInputs, buffers: _Buffers, mode: str) -> None:
        bucket, q0 = inputs.bucket, inputs.q
        batch = inputs.batch
        tokens = self._draw(self.model.hidden(batch, self.cache), buffers, mode, 0)
        step = buffers.step
        step.input_ids.copy_(tokens)
        step.positions.copy_(batch.positions.view(bucket, q0)[:, -1] + 1)
        step.slots.copy_(batch.slots)
        step.ctx_lens.copy_(batch.ctx_lens + 1)
        buffers.tokens[:, 0].copy_(tokens)
        buffers.index.fill_(1)

    def _next_step(self, buffers: _Buffers, mode: str) -> None:
        step, column = buffers.step, buffers.index.expand(buffers.bucket, 1)
        tokens = self._draw(self.model.hidden(step, self.cache), buffers, mode, column)
        buffers.tokens.scatter_(1, column, tokens[:, None])
        step.input_ids.copy_(tokens)
        step.positions.add_(1)
        step.ctx_lens.add_(1)
        buffers.index.add_(1)
