"""One model, its KV cache and the sequences it holds: what a draft or target worker stands on.

A sequence is its committed tokens plus what the cache holds. The cache may run ahead of the
committed tokens (speculative tokens from the last step) or behind them (tokens committed by
the other model that this one has not run yet: its "pending" tokens). `commit` appends newly
committed tokens and rolls the cache back to where it stops agreeing with them; the next
forward runs the pending tokens. Rollback is therefore a length change, never an RPC.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from bass.core.config import RunnerConfig
from bass.core.errors import InvalidRequestError, SequenceTooLongError, UnknownSequenceError
from bass.core.worker_api import AddSequence, WorkerInfo
from bass.engine.kv_cache import KVCache
from bass.engine.model import Transformer
from bass.engine.transfer import to_device
from bass.engine.weights import TORCH_DTYPES, eos_token_ids, load_config, load_weights
from bass.kernels.batch import RaggedBatch, SequenceChunk

log = logging.getLogger(__name__)

# Cache entry of a token that ran from a device tensor and whose id the host does not know yet.
PLACEHOLDER = -1


def use_device(device: str) -> None:
    """Make a model's device the current CUDA device of this thread (CUDA's is per thread), so
    that the streams, CUDA graphs and Triton launches of its model go there (a draft on cuda:1 in
    a process of its own, say): a service calls it before loading and in each handler thread.
    Two models on two devices in one thread would each need it around every call: not done; such
    a pair runs as separate services."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is not None and torch.cuda.is_available():  # "cuda" alone: the default
        torch.cuda.set_device(d)


@dataclass
class SequenceState:
    slot: int
    committed: list[int] = field(default_factory=list)


class ModelRunner:
    def __init__(self, config: RunnerConfig, model: Transformer | None = None):
        """Load the model from config.model_dir, or run `model` (benchmarks with random weights)."""
        self.config = config
        if model is None:
            self.model_config = load_config(config.model_dir)
            log.info("loading %s (%s, %s) on %s", config.model_dir, self.model_config.architecture,
                     config.dtype, config.device)
            weights = load_weights(config.model_dir, self.model_config, dtype=config.dtype, device=config.device)
            model = Transformer(self.model_config, weights, max_seq_len=config.max_seq_len,
                                attention=config.attention_backend, batch_invariant=config.batch_invariant,
                                int8_weights=bool(config.int8_weights), few_row_cuda=bool(config.few_row_cuda),
                                programmatic_launch=config.programmatic_launch)
        self.model_config = model.config
        self.model = model
        mc = self.model_config
        use_graphs = config.cuda_graphs and config.device.startswith("cuda") and config.attention_backend == "triton"
        self.cache = KVCache(num_layers=mc.num_layers, num_slots=config.num_slots + use_graphs,
                             max_seq_len=config.max_seq_len, num_kv_heads=mc.num_kv_heads,
                             head_dim=mc.head_dim, dtype=TORCH_DTYPES[config.dtype], device=config.device)
        self.graphs = self.prefill_graphs = None
        if use_graphs:
            from bass.engine.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self.model, self.cache, scratch_slot=self.cache.allocate())
            if not config.batch_invariant:  # a bucket's padding would change how a prompt's rows round
                from bass.engine.prefill_graphs import PrefillGraphs

                self.prefill_graphs = PrefillGraphs(self.model, self.cache, self.graphs.scratch_slot, self.graphs.pool)
        self.eos_token_ids = eos_token_ids(config.model_dir)
        self.sequences: dict[int, SequenceState] = {}

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def info(self) -> WorkerInfo:
        return WorkerInfo(model_name=self.config.model_dir.name, vocab_size=self.vocab_size,
                          num_slots=self.config.num_slots, max_seq_len=self.config.max_seq_len,
                          dtype=self.config.dtype, device=self.config.device,
                          eos_token_ids=self.eos_token_ids)

    # -- sequence lifecycle ------------------------------------------------------------------
    def add(self, items: Sequence[AddSequence]) -> None:
        """Admit new sequences: prefill each prompt except its last token (which the next step
        runs together with the drafts), then fork children from their parents' caches.
        All-or-nothing: on any error, nothing from this call stays allocated."""
        added: list[int] = []
        try:
            roots = [it for it in items if it.parent_id is None]
            for it in roots:
                self._check_new(it.seq_id)
                self._check_tokens("prompt_ids", it.prompt_ids)
                if len(it.prompt_ids) >= self.config.max_seq_len:
                    raise SequenceTooLongError(
                        f"prompt of {len(it.prompt_ids)} tokens does not fit max_seq_len={self.config.max_seq_len}")
                self.sequences[it.seq_id] = SequenceState(self.cache.allocate(), list(it.prompt_ids))
                added.append(it.seq_id)
            prefill = [self.sequences[it.seq_id] for it in roots if len(it.prompt_ids) > 1]
            if prefill:
                self.prefill(self.stage([(s, []) for s in prefill], [0] * len(prefill), run_all_but_last=True))
            for it in items:
                if it.parent_id is None:
                    continue
                self._check_new(it.seq_id)
                parent = self.get(it.parent_id)
                self.sequences[it.seq_id] = SequenceState(self.cache.fork(parent.slot), list(parent.committed))
                added.append(it.seq_id)
        except BaseException:
            self.release(added)
            raise

    def release(self, seq_ids: Sequence[int]) -> None:
        """Free sequences' slots; unknown ids are ignored, so release is idempotent."""
        for seq_id in seq_ids:
            state = self.sequences.pop(seq_id, None)
            if state is not None:
                self.cache.release(state.slot)

    def get(self, seq_id: int) -> SequenceState:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise UnknownSequenceError(f"sequence {seq_id} is not held by this worker") from None

    def commit(self, state: SequenceState, tokens: Sequence[int]) -> None:
        """Append committed tokens; drop cached tokens from where they disagree."""
        if not tokens:
            return
        self._check_tokens("committed", tokens)
        stable = len(state.committed)  # the cache agrees with everything committed before
        state.committed.extend(tokens)
        cached = self.cache.tokens(state.slot)
        end = min(len(cached), len(state.committed))
        keep = stable
        while keep < end and cached[keep] == state.committed[keep]:
            keep += 1
        if keep < len(cached):
            self.cache.truncate(state.slot, keep)

    def cached(self, state: SequenceState) -> int:
        """Tokens the cache holds for this sequence (committed or speculative)."""
        return self.cache.length(state.slot)

    def pending(self, state: SequenceState) -> int:
        """Committed tokens this model has not run yet."""
        return len(state.committed) - self.cache.length(state.slot)

    def rewind(self, state: SequenceState, pending: int) -> None:
        """Make at least `pending` tokens pending by forgetting cached ones (they are recomputed,
        with the same values). Lets a step give every sequence the same number of tokens, which
        is what a CUDA graph needs."""
        cached = self.cache.length(state.slot)
        missing = pending - (len(state.committed) - cached)
        if missing > 0 and cached >= missing:
            self.cache.truncate(state.slot, cached - missing)

    # -- forward -------------------------------------------------------------------------------
    def forward(self, work: list[tuple[SequenceState, list[int]]], logits_per_seq: list[int],
                run_all_but_last: bool = False) -> torch.Tensor:
        """One ragged forward: for each sequence its pending committed tokens followed by
        `extra` tokens (drafts). Returns fp32 logits for the last `logits_per_seq[i]` positions
        of each sequence, concatenated in order.

        With run_all_but_last, the last committed token stays pending (prefill)."""
        return self.run(self.stage(work, logits_per_seq, run_all_but_last))

    def run(self, chunks: list[SequenceChunk], fed: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits of staged chunks (`stage`, `stage_fed`), from a CUDA graph where one was
        captured for their shape. fed: device int64 [len(chunks), m], the last m tokens of every
        chunk, whose ids the host does not know (its lists hold placeholders there)."""
        if self.graphs is not None and self.graphs.eligible(chunks):
            return self.graphs.run(chunks, fed=fed)
        return self.model.forward(self._eager_batch(chunks, fed), self.cache)

    def prefill(self, chunks: list[SequenceChunk]) -> None:
        """Run staged chunks that need no logits (prompts but their last token) into the cache,
        from a prefill graph where one takes them (engine/prefill_graphs.py)."""
        if self.prefill_graphs is None or not self.prefill_graphs.run(chunks):
            self.model.hidden(RaggedBatch.build(chunks, self.device), self.cache)

    def _eager_batch(self, chunks: list[SequenceChunk], fed: torch.Tensor | None) -> RaggedBatch:
        batch = RaggedBatch.build(chunks, self.device)
        if fed is None:
            return batch
        m = fed.shape[1]
        if all(len(c.tokens) == m for c in chunks):  # every token fed (run ahead, a draft step)
            return replace(batch, input_ids=fed.reshape(-1))
        ends = np.cumsum([len(c.tokens) for c in chunks])
        index = (ends[:, None] - m + np.arange(m)[None, :]).reshape(-1)
        batch.input_ids[to_device(index, torch.int64, self.device)] = fed.reshape(-1)
        return batch

    def has_tail(self, chunks: list[SequenceChunk]) -> bool:
        """Whether `run_tail` can run these chunks (a graph and a tail were captured for them)."""
        return self.graphs is not None and self.graphs.has_tail(chunks)

    def run_tail(self, chunks: list[SequenceChunk], staged, fed: torch.Tensor | None = None):
        """The forward of staged chunks and the warm-up's tail after it, both as CUDA graphs
        (DecodeGraphs.run_tail); fed as in `run`."""
        return self.graphs.run_tail(chunks, staged, fed=fed)

    def stage(self, work: list[tuple[SequenceState, list[int]]], logits_per_seq: list[int],
              run_all_but_last: bool = False) -> list[SequenceChunk]:
        """What `forward` runs, without running it: reserves the cache positions of each
        sequence's pending tokens and `extra` tokens, and returns the batch's chunks."""
        chunks = []
        for (state, extra), n_logits in zip(work, logits_per_seq):
            start = self.cache.length(state.slot)
            end = len(state.committed) - 1 if run_all_but_last else len(state.committed)
            tokens = state.committed[start:end] + list(extra)
            self.cache.append(state.slot, tokens)
            chunks.append(SequenceChunk(slot=state.slot, start=start, tokens=tokens, logit_rows=n_logits))
        return chunks

    def reserve(self, state: SequenceState, n: int) -> int:
        """Reserve cache positions for n tokens that will run from a device tensor (placeholders
        until `settle`); returns the first position."""
        return self.cache.append(state.slot, [PLACEHOLDER] * n)

    def forward_fed(self, states: list[SequenceState], input_ids: torch.Tensor) -> torch.Tensor:
        """One token per sequence whose ids are already on the device (the previous draft
        step's winners): fp32 logits [len(states), V], with no host round trip in between, so
        the host queues the next step while the GPU runs this one. The cache records
        placeholders for these tokens; `settle` writes their values once the caller has copied
        all its results to the host."""
        return self.run(self.stage_fed(states), input_ids.view(-1, 1))

    def stage_fed(self, states: list[SequenceState]) -> list[SequenceChunk]:
        """What `forward_fed` runs, without running it: a placeholder position per sequence."""
        starts = self.cache.append_each([state.slot for state in states], PLACEHOLDER)
        return [SequenceChunk(slot=state.slot, start=start, tokens=[PLACEHOLDER], logit_rows=1)
                for state, start in zip(states, starts)]

    def commit_fed(self, states: list[SequenceState], positions: list[int], tokens: list[int]) -> bool:
        """Commit one token a sequence where a step run ahead already took it as its input from
        the device (a placeholder at positions[i], `forward_fed`): settle and commit in one pass,
        the steady state of regular decoding. The tokens are the worker's own (its race's), so
        not checked against the vocabulary. False, with nothing changed, where some position is
        not the sequence's next one (the caller then settles and commits one by one)."""
        if any(position != len(state.committed) for state, position in zip(states, positions)):
            return False
        self.cache.settle_each([state.slot for state in states], positions, tokens)
        for state, token in zip(states, tokens):
            state.committed.append(token)  # the cache holds it at that position: nothing to drop
        return True

    def settle(self, state: SequenceState, start: int, tokens: Sequence[int]) -> None:
        """The values of placeholder tokens run by forward_fed, from cache position `start`."""
        self.cache.settle(state.slot, start, list(tokens))

    def warm_up(self, graph_shapes: Sequence[tuple[int, int]] = (), tail=None) -> None:
        """One tiny forward, so the first real request does not pay for lazy initialization;
        with CUDA graphs, capture the step shapes (tokens per sequence, logit rows per
        sequence) the worker runs, for every batch size up to num_slots, each followed by a
        graph of `tail` (graphs.GraphTail) where one is given."""
        with torch.inference_mode():
            slot = self.cache.allocate()
            try:
                self.cache.append(slot, [0, 0])
                batch = RaggedBatch.build([SequenceChunk(slot=slot, start=0, tokens=[0, 0], logit_rows=1)], self.device)
                self.model.forward(batch, self.cache)
            finally:
                self.cache.release(slot)
            if self.graphs is not None and graph_shapes:
                self.graphs.precapture(list(graph_shapes), self.config.num_slots, tail=tail)
                if self.prefill_graphs is not None:
                    self.prefill_graphs.precapture()
            if self.device.type == "cuda" and self.config.attention_backend == "triton":
                self.compile_eager_variants()

    def compile_eager_variants(self) -> None:
        """One eager step for each attention-kernel variant that steps outside the CUDA graphs
        can launch (triton_attention.plan_representatives), on scratch slots with whatever their
        caches hold: Triton compiles each variant (and the other kernels of that shape) now
        rather than inside a request. Once per process; from Triton's disk cache after the
        first process on a machine."""
        from bass.kernels.triton_attention import _num_sms, plan_representatives

        mc = self.model_config
        shapes = plan_representatives(mc.num_heads // mc.num_kv_heads, mc.num_kv_heads, mc.head_dim,
                                      _num_sms(self.device), self.config.max_seq_len,
                                      min(self.config.num_slots, self.cache.free_slots))
        with torch.inference_mode():
            for batch, q, context in shapes:
                slots = [self.cache.allocate() for _ in range(batch)]
                try:
                    chunks = []
                    for slot in slots:
                        self.cache.append(slot, [0] * context)
                        chunks.append(SequenceChunk(slot=slot, start=context - q, tokens=[0] * q, logit_rows=1))
                    self.model.forward(RaggedBatch.build(chunks, self.device), self.cache)
                finally:
                    for slot in slots:
                        self.cache.release(slot)

    # -- checks ----------------------------------------------------------------------------------
    def _check_new(self, seq_id: int) -> None:
        if seq_id in self.sequences:
            raise InvalidRequestError("seq_id", f"sequence {seq_id} already exists")

    def _check_tokens(self, field_name: str, tokens: Sequence[int]) -> None:
        if field_name == "prompt_ids" and not tokens:
            raise InvalidRequestError(field_name, "must not be empty")
        vocab = self.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(field_name, f"token ids {bad[:5]} outside the vocabulary [0, {vocab})")
