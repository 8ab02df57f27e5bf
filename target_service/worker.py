"""TargetWorker: one ragged forward over [pending tokens, d1..dk] of every sequence, the
target's own token at each of those positions, and per-sequence verification (the longest
matching prefix); the cache keeps exactly the committed prefix afterwards.

A call has two halves (`start_verify`, then the pending call's `result`): the launch queues all
of its GPU work and an asynchronous copy of the verdicts to the host; the finish waits for that
copy and commits. Between the two the host is free, and that is where regular decoding gains:
the coordinator sends step t + 1 before it reads step t (coordinator/regular_pipeline.py), and a
regular step launched while the previous regular step is unfinished runs *ahead* of it. Its
input, the token step t decides, is taken from the device (`forward_fed`), so the GPU runs
step t + 1 while the host reads back and commits step t, instead of idling through it. The
cache records a placeholder for that input until step t's finish settles it.

On the CPU a sampled row's token can change at the finish (a top-k / top-p cut outside the
window of largest logits is redone exactly, `race_unsynced`; a GPU decides every row on the
device), after the step ahead already ran from the first value.
The finish then repairs the step ahead for those sequences: it re-runs their input with the
right token and races again, so what every sequence emits is exactly what step-by-step
decoding emits (tests/test_target_run_ahead.py).

Speculative steps gain the same way in-process: the draft's proposal stays on the device and
the target's forward reads it there (`start_verify(request, drafts=...)`), queued behind the
draft's forwards while their tokens travel to the host, so the GPU goes from the draft's last
forward straight to verification. The drafts' cache positions hold placeholders until the
finish, which settles the accepted ones from the verdicts (they are the emitted tokens); a
rejected draft stays a placeholder, which the commit drops (tests/test_device_drafts.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from bass.core.config import LOOKUP_WINDOW
from bass.core.worker_api import Verdict, VerifyRequest, VerifyResponse, WorkerInfo
from bass.engine import verify_tail
from bass.engine.draft_loop import max_lookup_tail
from bass.engine.lookup_tail import PAD, lookup_tail, stage_text
from bass.engine.runner import PLACEHOLDER, ModelRunner, SequenceState
from bass.engine.sampling import RowParams, noise_keys, race, race_unsynced
from bass.engine.transfer import HostCopy, to_device
from bass.engine.verification import verdict_columns
from bass.kernels.skinny_linear import ROW_BUCKETS


@dataclass
class LaunchedVerify:
    """A Verify whose GPU work is queued and whose verdicts are on their way to the host."""

    seq_ids: list[int]
    states: list[SequenceState]
    rows_per_seq: list[int]
    max_k: int
    logits: torch.Tensor | None = None  # [rows, vocab] fp32, kept for the exact race of flagged rows
    # Host values of the sampling inputs: (row SamplingParams, noise keys, padded drafts (None in a
    # regular step), draft counts).
    exact_inputs: tuple | None = None
    row_params: RowParams | None = None
    keys: torch.Tensor | None = None
    drafts: torch.Tensor | None = None
    draft_lens: torch.Tensor | None = None
    raced: torch.Tensor | None = None  # [rows] the target's token at every row (first pass)
    packed: HostCopy | None = None  # [seqs, 2 + max_k (+ rows flags)]: accepted, tokens, redo flags
    verdicts: torch.Tensor | None = None  # the same on the device, as first decided (until the next launch)
    revised: list[int] = field(default_factory=list)  # sequences whose verdicts the finish decided again
    # Run ahead of the previous call: the cache position of each sequence's input token, a
    # placeholder that the previous call's finish settles.
    fed_at: list[int] | None = None
    # Verified from the draft's tokens on the device: the cache position of each sequence's
    # first draft, placeholders of which this call's finish settles the accepted ones.
    drafts_at: list[int] | None = None
    # Lookup tokens appended to the device drafts (engine/lookup_tail.py): the last `tail` of
    # max_k. A proposal chained behind this call re-runs as many more tokens (start_chained).
    tail: int = 0
    # Repairs (see the module docstring): sequence index -> its token, decided again.
    overrides: dict[int, int] = field(default_factory=dict)
    response: VerifyResponse | None = None
    worker_s: float = 0.0  # host time inside the worker, launch and finish
    device_wait_s: float = 0.0  # of worker_s, blocked on the verdicts' copy from the device

    @property
    def regular(self) -> bool:
        return self.max_k == 0 and bool(self.seq_ids)


class PendingVerify:
    """TargetWorkerAPI's pending call, in-process: `result` finishes the call (and any
    launched before it); `discard` leaves it to be finished with the worker's next call."""

    def __init__(self, worker: "TargetWorker", launched: LaunchedVerify):
        self._worker, self._launched = worker, launched

    def result(self) -> VerifyResponse:
        return self._worker.finish(self._launched)

    @property
    def verdicts_on_device(self) -> torch.Tensor | None:
        """The call's verdicts as the device first decided them, [items, 2 + k, ...]: per
        sequence the drafts accepted, then the target's token at every row (what the draft's
        proposal for the next step is chained on, DraftWorker.start_chained). Valid until the
        worker's next call; None where the call ran nothing."""
        return self._launched.verdicts

    @property
    def tail(self) -> int:
        """Lookup tokens the worker appended to each sequence's device drafts (verified after
        them): a proposal chained behind this call passes it to DraftWorker.start_chained."""
        return self._launched.tail

    @property
    def revised(self) -> list[int]:
        """After `result`: the items whose verdicts the finish decided again on the host (on
        the CPU, a sampled row whose cut lay outside the window): their device verdicts were
        not final."""
        return self._launched.revised

    def ready(self) -> bool:
        """Whether `result` can answer without waiting for the GPU."""
        launched = self._launched
        return launched.response is not None or launched.packed.ready()

    def discard(self) -> None:
        pass


class TargetWorker:
    overlaps_calls = True  # regular decoding keeps one call in flight (see the module docstring)
    steps_in_flight = 1  # in-process the next call's launch follows the commit at once
    verifies_device_drafts = True  # start_verify(request, drafts=the draft's tokens on the GPU)

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._unfinished: list[LaunchedVerify] = []  # launched, in launch order
        self._deferred_release: list[int] = []  # held by an unfinished call when released

    def info(self) -> WorkerInfo:
        return self.runner.info()

    def warm_up(self) -> None:
        """Capture verification shapes: the pending token plus k drafts, k + 1 logit rows, for
        k = 0 (regular decoding) to graph_max_draft; each with the sampled verification tail."""
        self.runner.warm_up(graph_shapes=[(k + 1, k + 1) for k in range(self.runner.config.graph_max_draft + 1)],
                            tail=verify_tail.SampledVerifyTail(self.runner.model.logits))
        if self.runner.config.lookup_tail and self.runner.device.type == "cuda":
            # The lookup kernel runs outside the graphs: compile it now, not in a verification.
            text = torch.full((1, LOOKUP_WINDOW), PAD, dtype=torch.int64, device=self.runner.device)
            lookup_tail(text, torch.zeros((1, 1), dtype=torch.int64, device=self.runner.device), 1)

    def release(self, seq_ids: Sequence[int]) -> None:
        self._finish_all()
        self.runner.release(seq_ids)

    def reset(self) -> None:
        """Drop every sequence (the coordinator restarted or lost track of this worker)."""
        self._unfinished.clear()
        self._deferred_release.clear()
        self.runner.release(list(self.runner.sequences))

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        return self.start_verify(request).result()

    def start_verify(self, request: VerifyRequest, drafts: torch.Tensor | None = None) -> PendingVerify:
        """Queue a Verify. drafts (in-process): every item's draft tokens as a device tensor
        [items, k], in place of the items' own (empty) draft_tokens: the draft's proposal, still
        on the GPU, so that verification is queued behind the draft's forwards instead of
        waiting for their tokens to reach the host."""
        started = time.perf_counter()
        with torch.inference_mode():
            launched = self._launch(request, drafts)
        launched.worker_s += time.perf_counter() - started
        return PendingVerify(self, launched)

    def finish(self, launched: LaunchedVerify) -> VerifyResponse:
        """Finish every call up to `launched` (in launch order) and return its answer."""
        while launched.response is None:
            self._finish_next()
        return launched.response

    # -- launch --------------------------------------------------------------------------------
    def _launch(self, request: VerifyRequest, fed_drafts: torch.Tensor | None) -> LaunchedVerify:
        runner = self.runner
        items = list(request.items)
        if fed_drafts is not None:
            if any(it.draft_tokens for it in items) or fed_drafts.shape[0] != len(items):
                raise ValueError("device drafts replace the items' own: one row per item, items without drafts")
            if fed_drafts.device != runner.device:  # another GPU's proposal: through the host
                items = [replace(it, draft_tokens=tuple(row)) for it, row in zip(items, fed_drafts.tolist())]
                fed_drafts = None
            elif fed_drafts.shape[1] == 0:
                fed_drafts = None
            else:  # the draft's buffer is rewritten by its next call; a redo reads these later
                fed_drafts = fed_drafts.clone()
        while len(self._unfinished) > 1:  # run ahead of one call at most
            self._finish_next()
        previous = self._runs_ahead_of(request) if fed_drafts is None else None
        if previous is None:
            self._finish_all()
            runner.release(request.release)
        else:
            self._deferred_release.extend(request.release)
        runner.add(request.add)
        states = [runner.get(it.seq_id) for it in items]
        tail = 0
        if fed_drafts is not None:
            fed_drafts, tail = self._append_lookup(states, fed_drafts)
        counts = [len(it.draft_tokens) if fed_drafts is None else fed_drafts.shape[1] for it in items]
        rows_per_seq = [c + 1 for c in counts]
        launched = LaunchedVerify(seq_ids=[it.seq_id for it in items], states=states, rows_per_seq=rows_per_seq,
                                  max_k=max(counts, default=0), tail=tail)
        if not items:
            launched.response = VerifyResponse(verdicts=[])
            return launched
        # Staged, not run: whether the step's shape replays as CUDA graphs decides how it samples.
        if previous is None:
            drafted = [list(it.draft_tokens) for it in items] if fed_drafts is None else \
                [[PLACEHOLDER] * k for k in counts]
            chunks = runner.stage(list(zip(states, drafted)), rows_per_seq)
            fed = fed_drafts
            if fed is not None:  # the drafts' positions, settled from the verdicts (_finish_next)
                launched.drafts_at = [c.start + len(c.tokens) - k for c, k in zip(chunks, counts)]
            # Row j of sequence b decides the token at position len(committed) + j: every row races
            # with its own keyed noise, so a position is decided the same way whatever k was.
            decided = [len(s.committed) + j for s, n in zip(states, rows_per_seq) for j in range(n)]
        else:
            chunks = runner.stage_fed(states)
            launched.fed_at = [c.start for c in chunks]  # each input's position: the cache's length before it
            fed = self._inputs_from(previous, launched.seq_ids).view(-1, 1)
            decided = [p + 1 for p in launched.fed_at]
        sampled = not all(it.sampling.params.greedy for it in items)
        tail = sampled and runner.has_tail(chunks)
        if not tail:
            # The forward is queued first, and the host prepares the sampling inputs (pinned,
            # asynchronous copies) while the GPU runs it.
            launched.logits = runner.run(chunks, fed)
        row_params = [it.sampling.params for it, n in zip(items, rows_per_seq) for _ in range(n)]
        keys = None
        if sampled:
            keys = noise_keys([it.sampling.seed_key for it, n in zip(items, rows_per_seq) for _ in range(n)],
                              decided).numpy()
        drafts = fed_drafts if fed_drafts is not None or not launched.max_k else \
            [list(it.draft_tokens) + [0] * (launched.max_k - c) for it, c in zip(items, counts)]
        launched.exact_inputs = (row_params, keys, drafts, counts)
        if tail:
            # The sampled tail replays as a graph (engine/verify_tail.py): one launch for what
            # is eagerly some sixty. Graphs run on a GPU, whose race decides every row on the
            # device: no redo flags, so no logits are kept for one.
            staged = verify_tail.stage(row_params, keys, runner.graphs.bucket(len(items)), launched.max_k + 1)
            packed, raced = runner.run_tail(chunks, staged, fed)
            launched.raced = raced[:len(row_params)].clone()
            packed = packed[:len(items)]
        else:
            self._exact_inputs(launched)
            launched.raced, redo = race_unsynced(launched.logits, launched.row_params, launched.keys)
            packed = self._verdict_columns(launched, redo)
        launched.verdicts = packed
        launched.packed = HostCopy(packed)
        self._unfinished.append(launched)
        return launched

    def _append_lookup(self, states: list[SequenceState], drafts: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The draft's tokens [B, k] followed by up to `lookup_tail` lookup tokens a sequence
        (engine/lookup_tail.py), and how many were appended: no more than the proposal chained
        behind them can re-run at this batch (draft_loop.max_lookup_tail: within the draft's
        few-row path) or the verification graphs take, at one sequence no more than keep the
        verification within 8 rows, and none where a cache has no room for them or a sequence
        is shorter than the tokens a chained proposal re-runs."""
        config = self.runner.config
        k = drafts.shape[1]
        m = min(config.lookup_tail, config.graph_max_draft - k, max_lookup_tail(len(states)))
        if len(states) == 1:
            # One sequence's verification stays within the few-row products' first row group
            # (1-8 rows): a step of 9 rounds differently and cost an H200 0.13-0.28 ms a step
            # more, 10% a token at one sequence, on the fused layers. At two sequences the tail
            # pays for its wider step (6-14% faster with 6 than with 2; both in
            # bench/results/2026-11-28-h200x2-lookup-tails/), so only one sequence is capped.
            # It still pays with 9-16-row steps on the faster of the fused and folded layers
            # (dbdce1f): uncapped, one sequence ran 3-4% slower at k = 3, 4 and `auto` (H200,
            # 0a2199f; bench/results/journal/2026-11-28-h200x2-readme-table.md).
            m = min(m, ROW_BUCKETS[0] - 1 - k)
        # A proposal chained behind this call re-runs the last m + 1 committed tokens: a
        # sequence must have them (a prompt of one or two tokens, before any output).
        if (m <= 0
                or any(len(s.committed) + k + m > config.max_seq_len or len(s.committed) < m + 1 for s in states)):
            return drafts, 0
        text = to_device(stage_text([s.committed for s in states]), torch.int64, drafts.device)
        return torch.cat([drafts, lookup_tail(text, drafts, m)], dim=1), m

    def _exact_inputs(self, launched: LaunchedVerify) -> None:
        """The call's sampling inputs on the device (row parameters, noise keys, drafts); a
        graph-replayed tail staged them as one vector instead."""
        if launched.row_params is not None:
            return
        row_params, keys, drafts, counts = launched.exact_inputs
        device = self.runner.device
        launched.row_params = RowParams.build(row_params, device)
        if keys is not None:
            launched.keys = to_device(torch.from_numpy(keys), torch.int64, device)
        if launched.max_k == 0:  # a regular step: no drafts to compare, none to copy to the device
            launched.drafts = torch.empty((len(counts), 0), dtype=torch.int64, device=device)
            launched.draft_lens = torch.zeros(len(counts), dtype=torch.int64, device=device)
            return
        launched.drafts = drafts if isinstance(drafts, torch.Tensor) else \
            to_device(drafts, torch.int64, device).view(len(drafts), launched.max_k)
        launched.draft_lens = to_device(counts, torch.int64, device)

    def _runs_ahead_of(self, request: VerifyRequest) -> LaunchedVerify | None:
        """The unfinished call this one can run ahead of: a regular step right after a regular
        step, over sequences that call holds, with nothing to add and room in every cache."""
        if not self._unfinished or request.add or not request.items:
            return None
        previous = self._unfinished[0]
        seq_ids = [it.seq_id for it in request.items]
        if not previous.regular or any(it.draft_tokens for it in request.items) or len(set(seq_ids)) != len(seq_ids):
            return None
        runner = self.runner
        if seq_ids == previous.seq_ids:  # the steady state: the same sequences as the step before
            states = previous.states
        else:
            held = set(previous.seq_ids)
            if any(seq_id not in held for seq_id in seq_ids):
                return None
            states = [runner.get(seq_id) for seq_id in seq_ids]
        room = runner.cache.max_seq_len
        return previous if all(runner.cached(state) < room for state in states) else None

    def _inputs_from(self, previous: LaunchedVerify, seq_ids: list[int]) -> torch.Tensor:
        """The tokens `previous` decides for these sequences, on the device."""
        tokens = previous.raced  # one row per sequence in a regular step
        if seq_ids == previous.seq_ids:
            return tokens
        index = {seq_id: i for i, seq_id in enumerate(previous.seq_ids)}
        return tokens[to_device([index[s] for s in seq_ids], torch.int64, tokens.device)]

    @staticmethod
    def _verdict_columns(launched: LaunchedVerify, redo: torch.Tensor | None) -> torch.Tensor:
        """[accepted, tokens..., redo flags...] per sequence, on the device."""
        return verdict_columns(launched.raced, redo, launched.drafts, launched.draft_lens, launched.rows_per_seq)

    # -- finish --------------------------------------------------------------------------------
    def _finish_all(self) -> None:
        while self._unfinished:
            self._finish_next()

    @torch.inference_mode()
    def _finish_next(self) -> None:
        started = time.perf_counter()
        launched = self._unfinished.pop(0)
        following = self._unfinished[0] if self._unfinished and self._unfinished[0].fed_at is not None else None
        first_pass, tokens = self._read_verdicts(launched)
        runner = self.runner
        stale = []
        if (following is not None and launched.regular and following.seq_ids == launched.seq_ids
                and runner.commit_fed(launched.states, following.fed_at, [emitted[0] for emitted in tokens])):
            # The steady state of regular decoding: the following call ran from these very
            # sequences' tokens, which are settled as its inputs and committed in one pass.
            stale = [i for i, (first, emitted) in enumerate(zip(first_pass, tokens)) if first != emitted[0]]
            verdicts = [Verdict(accepted=0, tokens=emitted) for emitted in tokens]
        else:
            if following is not None:
                # Its inputs were this call's first-pass tokens: settle their placeholders with the
                # final ones; where the two differ it ran from a wrong token and is repaired below.
                index = {seq_id: i for i, seq_id in enumerate(launched.seq_ids)}
                for j, (seq_id, state, position) in enumerate(zip(following.seq_ids, following.states,
                                                                  following.fed_at)):
                    i = index[seq_id]
                    runner.settle(state, position, [tokens[i][0]])
                    if first_pass[i] != tokens[i][0]:
                        stale.append(j)
            verdicts = []
            for j, (state, emitted) in enumerate(zip(launched.states, tokens)):
                if launched.drafts_at is not None:
                    # The accepted drafts are the emitted tokens; a rejected one stays a placeholder,
                    # which no committed token equals, so the commit drops it from the cache.
                    runner.settle(state, launched.drafts_at[j], emitted[:-1])
                runner.commit(state, emitted)
                verdicts.append(Verdict(accepted=len(emitted) - 1, tokens=emitted))
        if stale:
            self._repair(following, stale)
        if self._deferred_release:
            held = {seq_id for call in self._unfinished for seq_id in call.seq_ids}
            free = [seq_id for seq_id in self._deferred_release if seq_id not in held]
            self._deferred_release = [seq_id for seq_id in self._deferred_release if seq_id in held]
            runner.release(free)
        launched.worker_s += time.perf_counter() - started
        launched.response = VerifyResponse(verdicts=verdicts, compute_s=launched.worker_s,
                                           device_wait_s=launched.device_wait_s)
        # The call's device memory goes with it.
        launched.logits = launched.keys = launched.verdicts = None

    def _read_verdicts(self, launched: LaunchedVerify) -> tuple[list[int], list[list[int]]]:
        """(the first row's token per sequence as the device first decided it, with repairs;
        the tokens each sequence emits). Rows whose cut the window did not hold (flagged, CPU)
        are raced again exactly, then the verdicts are read once more."""
        waited = time.perf_counter()
        rows = launched.packed.tolist()
        launched.device_wait_s += time.perf_counter() - waited
        width = launched.max_k + 2  # accepted + max_k + 1 tokens, then the flags
        for i, token in launched.overrides.items():
            rows[i] = [0, token] + [0] * (len(rows[i]) - 2)  # a regular step: no drafts, no flags
        first_pass = [row[1] for row in rows]
        flagged, offset = [], 0
        launched.revised = sorted(launched.overrides)
        if len(rows[0]) > width:
            for i, (row, n) in enumerate(zip(rows, launched.rows_per_seq)):
                rows_flagged = [offset + j for j in range(n) if row[width + j]]
                if rows_flagged:
                    flagged += rows_flagged
                    launched.revised.append(i)
                offset += n
        if flagged:
            self._exact_inputs(launched)
            index = to_device(flagged, torch.int64, launched.raced.device)
            launched.raced[index] = race(launched.logits[index], launched.row_params.take(index), launched.keys[index])
            rows = self._verdict_columns(launched, None).tolist()
        return first_pass, [row[1:row[0] + 2] for row in rows]

    def _repair(self, launched: LaunchedVerify, stale: list[int]) -> None:
        """Sequences of `launched` (run ahead) whose input token was decided again after it ran:
        run that token once more (its cache position becomes pending again) and race the row
        again; the result replaces the row's token on the device (for any call run ahead of
        this one) and in what its finish reads."""
        runner = self.runner
        self._exact_inputs(launched)
        states = [launched.states[j] for j in stale]
        for state in states:
            runner.rewind(state, 1)
        logits = runner.forward([(state, []) for state in states], [1] * len(states))
        index = to_device(stale, torch.int64, logits.device)
        keys = None if launched.keys is None else launched.keys[index]
        tokens = race(logits, launched.row_params.take(index), keys)
        launched.raced[index] = tokens
        launched.overrides.update(zip(stale, tokens.tolist()))
