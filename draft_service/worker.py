"""DraftWorker: k autoregressive draft steps for every sequence of the batch at once.

The first forward runs each sequence's pending committed tokens (a ragged batch); each later
forward feeds one token per sequence still drafting. A sampled draft token is the winner of
the target's Gumbel race at that position (same keyed noise) run over the draft's own
distribution, its top-k / top-p cut found among its top-N tokens: nothing but the tokens goes
back, since the verifier only compares them with its own.

On a GPU, the steady state (every sequence drafts the same k after the same number of pending
tokens) runs as self-feeding CUDA graphs (engine/draft_loop.py); other steps run forward by
forward, each token fed from the device to the next.

A proposal is started (`start_propose`: the forwards and the copy of the tokens to the host
queued) and answered (`PendingProposal.result`); in-process, the target verifies from the
started proposal's tokens on the device in between (target_service/worker.py).

In-process, the next step's proposal can also be *chained* behind a verification
(`start_chained`): queued on the GPU right after the target's forward, before the host has read
its verdicts, its first forward takes each sequence's last two committed tokens and their
positions from the verdicts on the device. The GPU then goes from verifying step t straight to
drafting step t + 1 while the host reads and commits step t, instead of idling through that
commit and the next step's set-up (~1.3 ms a step on an H100 at batch 1). The host learns what
the chained forward ran once the verdicts are read (`ChainedProposal.reconcile`).
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import torch

from bass.core.errors import InvalidRequestError
from bass.core.worker_api import ProposeItem, ProposeRequest, ProposeResponse, StreamControl, WorkerInfo
from bass.engine.draft_loop import CHAINED_FIRST_TOKENS, FIRST_STEP_TOKENS, MAX_STEPS, DraftLoopGraphs
from bass.engine.runner import PLACEHOLDER, ModelRunner, SequenceState
from bass.engine.sampling import RowParams, draft_race, noise_keys
from bass.engine.transfer import HostCopy, to_device
from bass.kernels.batch import SequenceChunk

# Pending tokens per sequence, less the one left for the proposal's first forward, that a
# catch-up after regular steps runs as a captured graph (rewound up to the next size). A k = 0
# probe of auto leaves three regular steps behind, so four; a longer regular stretch up to 32.
CATCH_UP_TOKENS = (4, 8, 16, 32)


class DraftWorker:
    def __init__(self, runner: ModelRunner, top_n: int = 64, loop: DraftLoopGraphs | None = None):
        """top_n: the window of the draft's most likely tokens its top-k / top-p cut is found in.
        loop: the self-feeding draft graphs; by default built where the runner captures graphs."""
        if top_n < 1:
            raise InvalidRequestError("draft_top_n", f"must be >= 1, got {top_n}")
        self.runner = runner
        self.top_n = top_n
        self.sample = functools.partial(draft_race, window=top_n)
        if loop is None and runner.graphs is not None:
            loop = DraftLoopGraphs(runner.model, runner.cache, runner.graphs.scratch_slot, self.sample,
                                   pool=runner.graphs.pool)
        self.loop = loop
        # Per sequence, how many tokens at the end of its committed list were only assumed
        # (ProposeItem.assumed): dropped at the sequence's next call.
        self._assumed: dict[int, int] = {}
        # A draft stream (draft_service/stream.py) continues its proposals on the device
        # (`extend`): the last proposal's (seq_ids, states), where it was started extendable, ran
        # through the self-feeding graphs and nothing else ran since.
        self._open_run: tuple[list[int], list[SequenceState]] | None = None

    def info(self) -> WorkerInfo:
        return self.runner.info()

    def warm_up(self) -> None:
        """Capture the draft's step shapes: the first forward of a step runs two or three
        tokens per sequence (see the rewind in _propose), the later ones one, a catch-up after
        regular steps one of CATCH_UP_TOKENS; one logit row each. Then the self-feeding graphs
        of whole proposals."""
        shapes = [(q0, 1) for q0 in FIRST_STEP_TOKENS + CATCH_UP_TOKENS] + [(1, 1)]
        self.runner.warm_up(graph_shapes=shapes)
        if self.loop is not None:
            with torch.inference_mode():
                self.loop.prepare(self.runner.config.num_slots)

    def release(self, seq_ids: Sequence[int]) -> None:
        self._open_run = None
        for seq_id in seq_ids:
            self._assumed.pop(seq_id, None)
        self.runner.release(seq_ids)

    def reset(self) -> None:
        """Drop every sequence (the coordinator restarted or lost track of this worker)."""
        self._assumed.clear()
        self._open_run = None
        self.runner.release(list(self.runner.sequences))

    def propose(self, request: ProposeRequest) -> ProposeResponse:
        return self.start_propose(request).result()

    def open_stream(self, first: StreamControl):
        """Draft ahead on a thread of this process (draft_service/stream.py): streamed
        speculation with the draft in the coordinator's process."""
        from bass.draft_service.stream import LocalDraftStream  # the stream builds on this module
        return LocalDraftStream(self, first)

    def start_propose(self, request: ProposeRequest, extendable: bool = False) -> "PendingProposal":
        """Queue a proposal's forwards and the copy of its tokens to the host. In-process, the
        target can verify from `PendingProposal.on_device` before the tokens reach the host.
        extendable: `extend` may continue it (its noise keys cover every step a run can reach)."""
        started = time.perf_counter()
        with torch.inference_mode():
            pending = self._launch(request, extendable)
        pending.worker_s += time.perf_counter() - started
        return pending

    def _launch(self, request: ProposeRequest, extendable: bool = False) -> "PendingProposal":
        runner = self.runner
        self._open_run = None
        runner.release(request.release)
        runner.add(request.add)
        items = list(request.items)
        states = [runner.get(it.seq_id) for it in items]
        for it in items:
            if it.num_tokens < 0:
                raise InvalidRequestError("num_tokens", f"must be >= 0, got {it.num_tokens}")
        for state, it in zip(states, items):
            self._commit(it.seq_id, state, tuple(it.committed), tuple(it.assumed))
        active = [i for i, it in enumerate(items) if it.num_tokens > 0]
        drafting = [states[i] for i in active]
        if runner.graphs is not None or self.loop is not None:
            self._even_out_pending(drafting)

        rows = [items[i].num_tokens for i in active]
        steps = max(rows, default=0)
        params = [items[i].sampling.params for i in active]
        keys = None
        if not all(p.greedy for p in params):
            # Every step's noise keys: row n, column j is (sequence n, position base + j).
            # An extended run keys its later steps with the columns past `steps`.
            width = MAX_STEPS if extendable and self.loop is not None else steps
            keys = noise_keys([items[i].sampling.seed_key for i in active for _ in range(width)],
                              [len(states[i].committed) + j for i in active for j in range(width)])
            keys = keys.view(len(active), width)
        if not active:
            return PendingProposal(runner, len(items), [], [], [], None)
        if self._loop_fits(drafting, rows, keys is not None):
            tokens = self._propose_looped(drafting, steps, None if keys is None else params, keys)
            decode = None
            if extendable:
                self._open_run = ([items[i].seq_id for i in active], drafting)
        elif len(set(rows)) == 1:
            tokens = torch.stack([t for _, t in self._propose_stepwise(drafting, rows, params, keys)], dim=1)
            decode = None
        else:  # per-sequence lengths: the tokens of each step, for the sequences still drafting
            winners = self._propose_stepwise(drafting, rows, params, keys)
            tokens = torch.cat([t for _, t in winners])
            decode = functools.partial(_by_sequence, [live for live, _ in winners], len(drafting))
        return PendingProposal(runner, len(items), active, drafting, rows, tokens, decode)

    def _commit(self, seq_id: int, state: SequenceState, committed: tuple[int, ...], assumed: tuple[int, ...]) -> None:
        """Commit a sequence's new tokens, after dropping what its last call only assumed, then
        assume this call's block. One commit of both keeps every cached token they confirm:
        after a block accepted whole, the draft already ran all but the last of the tokens it
        proposed beyond it, so one forward token is pending, as after a regular step."""
        runner = self.runner
        n = self._assumed.pop(seq_id, 0)
        if n:
            del state.committed[-n:]
        runner.commit(state, committed + assumed)
        if runner.cached(state) > len(state.committed):  # nothing new came: forget what was assumed
            runner.cache.truncate(state.slot, len(state.committed))
        if assumed:
            self._assumed[seq_id] = len(assumed)

    def _propose_stepwise(self, states: list[SequenceState], rows: list[int], params: list,
                          keys: torch.Tensor | None) -> list[tuple[list[int], torch.Tensor]]:
        """Forward by forward, for any per-sequence lengths: step j's winners feed step j + 1
        straight from the device, so the host never waits for a draft token. Returns, per step,
        the sequences still drafting and their tokens (on the device)."""
        runner, device = self.runner, self.runner.device
        rows_params = RowParams.build(params, device)
        if keys is not None:
            keys = to_device(keys, torch.int64, device)
        winners: list[tuple[list[int], torch.Tensor]] = []
        for j in range(max(rows, default=0)):
            live = [n for n in range(len(states)) if rows[n] > j]
            live_index = None if len(live) == len(states) else to_device(live, torch.int64, device)
            live_states = [states[n] for n in live]
            if j == 0:
                logits = runner.forward([(state, []) for state in live_states], [1] * len(live))
            else:
                prev_live, prev_tokens = winners[-1]
                if len(live) < len(prev_live):  # per-sequence lengths: some stopped drafting
                    keep = to_device([prev_live.index(n) for n in live], torch.int64, device)
                    prev_tokens = prev_tokens[keep]
                logits = runner.forward_fed(live_states, prev_tokens)
            live_params = rows_params if live_index is None else rows_params.take(live_index)
            step_keys = None if keys is None else keys[:, j] if live_index is None else keys[live_index, j]
            winners.append((live, self.sample(logits, live_params, step_keys)))
        return winners

    # -- chained proposals -----------------------------------------------------------------------
    def chains(self, num_seqs: int, k: int, verified_k: int, sampled: bool, tail: int = 0) -> bool:
        """Whether a proposal of k tokens for num_seqs sequences can be chained behind a
        verification of verified_k drafts each, the last `tail` of them lookup tokens the
        target appended (the self-feeding graphs run it; the noise keys of every position it
        may start from fit their buffer)."""
        return (self.loop is not None and k >= 1 and verified_k + k <= MAX_STEPS
                and self.loop.eligible(num_seqs, CHAINED_FIRST_TOKENS + tail, k, "sampled" if sampled else "greedy"))

    def extend(self, seq_ids: Sequence[int], m: int) -> "PendingProposal | None":
        """Continue the last proposal by m tokens for each of its sequences (`seq_ids`, in its
        order), on the device: m more replays of the self-feeding graph, no host input, so it
        can be queued before the last proposal's tokens are read. None where that proposal
        cannot be continued (it did not run through the graphs, something ran since, its
        sequences differ, or the run's token buffer or a cache is full): make a proposal.
        The answer's tokens are the m new ones; the cache records the last proposal's final
        token and m - 1 of them (settled when read)."""
        runner = self.runner
        ids, states = self._open_run if self._open_run is not None else (None, None)
        if (states is None or ids != list(seq_ids) or m < 1
                or not self.loop.extendable(m)
                or any(runner.cached(s) + m + 1 > runner.cache.max_seq_len for s in states)):
            return None
        started = time.perf_counter()
        with torch.inference_mode():
            for state in states:
                runner.reserve(state, m)
            tokens = self.loop.extend(len(states), m)
        pending = PendingProposal(runner, len(states), list(range(len(states))), states, [m + 1] * len(states),
                                  tokens, drop_first=True)
        pending.worker_s += time.perf_counter() - started
        return pending

    def start_chained(self, request: ProposeRequest, verdicts: torch.Tensor, verified_k: int,
                      tail: int = 0) -> "ChainedProposal":
        """Queue the next step's proposal behind a verification, before its verdicts reach the
        host. request.items: the verified sequences in the verification's order, each with the
        same num_tokens and nothing committed (this worker holds exactly what the target held
        before verifying: the verified drafts were this worker's); request.release: applied
        first. verdicts: the verification's [j, tokens...] rows on the device (valid until the
        target's next call); verified_k: the drafts verified a sequence, the last `tail` of them
        lookup tokens the target appended, which this worker never ran: the first forward
        re-runs that many more of the sequence's committed tokens. The caller must `reconcile`
        the proposal with the verdicts the host reads, before this worker's next call, and must
        check `chains` first."""
        started = time.perf_counter()
        runner = self.runner
        self._open_run = None
        with torch.inference_mode():
            runner.release(request.release)
            items = list(request.items)
            k = items[0].num_tokens if items else 0
            params = [it.sampling.params for it in items]
            sampled = not all(p.greedy for p in params)
            if (not items or any(it.num_tokens != k or it.committed or it.assumed or it.seq_id in self._assumed
                                 for it in items)
                    or not self.chains(len(items), k, verified_k, sampled, tail)):
                raise ValueError("a chained proposal drafts the same k >= 1 for every sequence, with nothing "
                                 "committed or assumed, in a shape the self-feeding graphs run")
            states = [runner.get(it.seq_id) for it in items]
            bases = [len(s.committed) for s in states]
            if any(base + verified_k + k > runner.cache.max_seq_len for base in bases):
                raise ValueError("a chained proposal must fit the cache whatever the verification accepts")
            window = CHAINED_FIRST_TOKENS + tail  # tokens the first forward runs a sequence
            if any(base < window - 1 for base in bases):
                raise ValueError(f"a chained proposal after {tail} lookup tokens re-runs {window - 1} committed tokens")
            chunks = [SequenceChunk(slot=s.slot, start=base - window + 1, tokens=s.committed[-(window - 1):] + [0],
                                    logit_rows=1)
                      for s, base in zip(states, bases)]
            keys = None
            if sampled:  # position base + 1 + i, for any accepted count j and step m: i = j + m
                width = verified_k + k
                keys = noise_keys([it.sampling.seed_key for it in items for _ in range(width)],
                                  [base + 1 + i for base in bases for i in range(width)]).view(len(items), width)
            timer = _GpuTimer(runner.device)
            tokens = self.loop.run_chained(chunks, k, verdicts, params if sampled else None, keys)
            timer.stop()
            chained = ChainedProposal(runner, items, states, bases, k, tokens, timer, window)
        chained.worker_s += time.perf_counter() - started
        return chained

    # -- the self-feeding graphs ---------------------------------------------------------------
    def _even_out_pending(self, drafting: list[SequenceState]) -> None:
        """The first draft forward runs each sequence's pending tokens: one after a rejection,
        two after full acceptance, three after a regular step that followed one. Re-running up
        to two cached tokens where fewer are pending (the values come out the same) makes the
        step uniform, so it replays a CUDA graph instead of running eagerly. More pending
        tokens (after regular steps) are caught up on first (`_catch_up`)."""
        runner = self.runner
        most = max((runner.pending(s) for s in drafting), default=0)
        if FIRST_STEP_TOKENS[-1] < most <= CATCH_UP_TOKENS[-1] + 1:
            self._catch_up(drafting, most)
            most = max(runner.pending(s) for s in drafting)
        if most <= FIRST_STEP_TOKENS[-1]:
            for state in drafting:
                runner.rewind(state, max(most, FIRST_STEP_TOKENS[0]))

    def _catch_up(self, drafting: list[SequenceState], most: int) -> None:
        """Each regular step leaves the draft one more token to run. Run all but the last of
        each sequence's pending tokens in one forward of a captured shape (every sequence
        rewound to the same count, as above), so that the proposal after it runs through the
        self-feeding graphs: else its first forward ran eagerly and the rest step by step
        (auto's k = 0 probes and every return from regular decoding paid that). Sequences too
        short to rewind that far keep the old path."""
        runner = self.runner
        size = next(c for c in CATCH_UP_TOKENS if c + 1 >= most)
        for state in drafting:
            runner.rewind(state, size + 1)
        if all(runner.pending(state) == size + 1 for state in drafting):
            runner.forward([(state, []) for state in drafting], [1] * len(drafting), run_all_but_last=True)

    def _loop_fits(self, states: list[SequenceState], rows: list[int], sampled: bool) -> bool:
        """Whether this proposal is one the self-feeding graphs run: every sequence drafts the
        same k after the same number of pending tokens, and the cache has room for all of it
        (otherwise the forward-by-forward path runs, and reports a full sequence as before)."""
        if self.loop is None or not rows or len(set(rows)) != 1:
            return False
        runner = self.runner
        pending = {runner.pending(s) for s in states}
        k = rows[0]
        if len(pending) != 1 or not self.loop.eligible(len(states), pending.pop(), k, "sampled" if sampled else "greedy"):
            return False
        return all(len(s.committed) + k - 1 <= runner.cache.max_seq_len for s in states)

    def _propose_looped(self, states: list[SequenceState], k: int, params: list | None,
                        keys: torch.Tensor | None) -> torch.Tensor:
        """Through the self-feeding graphs: stage the first forward and reserve the fed tokens'
        positions (settled once the tokens are back). Returns the tokens [len(states), k], on
        the device."""
        runner = self.runner
        chunks = runner.stage([(state, []) for state in states], [1] * len(states))
        for state in states:
            runner.reserve(state, k - 1)
        return self.loop.run(chunks, k, params, keys)


def _by_sequence(steps: list[list[int]], num_seqs: int, values: list[int]) -> list[list[int]]:
    """Per sequence, its tokens out of the tokens of every step (`steps`: the sequences each
    step ran, in order), concatenated."""
    drafts: list[list[int]] = [[] for _ in range(num_seqs)]
    offset = 0
    for live in steps:
        for n, t in zip(live, values[offset:offset + len(live)]):
            drafts[n].append(t)
        offset += len(live)
    return drafts


class PendingProposal:
    """A proposal whose forwards are queued and whose tokens are on their way to the host.
    `on_device`: every item's tokens [items, k] on the GPU, where every item drafts the same
    k (else None); valid until the worker's next call. `result` waits for the copy, records
    the fed tokens' ids in the cache (they ran as placeholders) and answers."""

    draft_s = None  # in-process: the host's wait for `result` is the proposal's cost

    def __init__(self, runner: ModelRunner, num_items: int, active: list[int], states: list[SequenceState],
                 rows: list[int], tokens: torch.Tensor | None, decode=None, drop_first: bool = False):
        """tokens: [len(states), k] on the device, or, with decode (host values -> per-sequence
        lists), any layout decode reads; `active`: the items (of num_items) that draft.
        drop_first: the first column is a token already answered (an extension's), only settled."""
        self._runner, self._num_items, self._active, self._states, self._rows = runner, num_items, active, states, rows
        self._decode, self._drop_first = decode, drop_first
        # Every token after a sequence's first ran from the device, at the cache's last positions.
        self._fed_at = [runner.cached(s) - (r - 1) for s, r in zip(states, rows)]
        self._copy = HostCopy(tokens) if tokens is not None else None
        self.on_device = tokens if decode is None and len(active) == num_items else None
        self.worker_s = 0.0
        self._response: ProposeResponse | None = None

    def result(self) -> ProposeResponse:
        if self._response is not None:
            return self._response
        started = time.perf_counter()
        drafts: list[list[int]] = []
        if self._copy is not None:
            values = self._copy.tolist()
            drafts = values if self._decode is None else self._decode(values)
        for state, start, tokens, n in zip(self._states, self._fed_at, drafts, self._rows):
            if n > 1:
                self._runner.settle(state, start, tokens[:n - 1])
        if self._drop_first:
            drafts = [tokens[1:] for tokens in drafts]
        out: list[list[int]] = [[] for _ in range(self._num_items)]
        for i, tokens in zip(self._active, drafts):
            out[i] = tokens
        self.worker_s += time.perf_counter() - started
        self._response = ProposeResponse(tokens=out, compute_s=self.worker_s)
        return self._response


class _GpuTimer:
    """How long queued work runs on the GPU (events around it); on the CPU, where the work ran
    when queued, the host's time."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._started = time.perf_counter()
        self._host_s = 0.0
        if self._cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()

    def stop(self) -> None:
        if self._cuda:
            self._end.record()
        else:
            self._host_s = time.perf_counter() - self._started

    def seconds(self) -> float:
        """The time; on a GPU, waits for the work to finish."""
        if not self._cuda:
            return self._host_s
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1000


class ChainedProposal:
    """A proposal queued behind a verification (DraftWorker.start_chained). Its first forward
    ran at positions that depend on the verdicts, so the cache's record of it waits for them:
    `reconcile` (the verdicts as the host read them), then `select` the sequences the next
    verification runs (a subset: some finished meanwhile), whose `on_device` tokens it reads and
    whose `result` brings them to the host."""

    queued = True  # in-process, every chain asked for is queued

    def __init__(self, runner: ModelRunner, items: list[ProposeItem], states: list[SequenceState],
                 bases: list[int], k: int, tokens: torch.Tensor, timer: _GpuTimer,
                 width: int = CHAINED_FIRST_TOKENS):
        self._runner, self._states, self._bases, self.k = runner, states, bases, k
        self._width = width  # committed tokens the first forward ran a sequence
        self.seq_ids = [it.seq_id for it in items]
        self._tokens = tokens
        self._copy = HostCopy(tokens)
        self._timer = timer
        self._fed_at: list[int | None] = [None] * len(states)  # where each sequence's fed drafts sit, once known
        self.reconciled = False
        self.worker_s = 0.0

    @property
    def gpu_s(self) -> float:
        """The proposal's time on the GPU (waits for it)."""
        return self._timer.seconds()

    def reconcile(self, emitted: Sequence[Sequence[int]], revised: Sequence[int] = ()) -> None:
        """Commit what the verification emitted for each sequence (in the request's order) and
        record what the chained forward cached: the sequence's last `width` committed tokens,
        then k - 1 fed drafts (settled by `result`). `revised`: sequences whose verdicts the target
        changed after the device had them (a sampled row decided again on the host): the chained
        forward ran from the first ones, so their cache is kept only up to what the verification
        could not have touched, and is recomputed by the next proposal."""
        runner, revised = self._runner, set(revised)
        for i, (state, base, tokens) in enumerate(zip(self._states, self._bases, emitted)):
            if not self._holds(i):
                continue
            runner.commit(state, tokens)
            cached = runner.cached(state)
            width = self._width
            first = base + len(tokens) - width  # the position of the chained forward's first token
            if i in revised or cached < first:
                # Positions from `base` on may hold keys and values of other tokens.
                runner.cache.truncate(state.slot, min(cached, base))
                continue
            runner.cache.truncate(state.slot, first)
            runner.cache.append(state.slot, state.committed[-width:] + [PLACEHOLDER] * (self.k - 1))
            self._fed_at[i] = first + width
        self.reconciled = True

    def select(self, seq_ids: Sequence[int]) -> "SelectedProposal":
        """The proposal of these sequences (in this order; each one of the chained ones)."""
        index = {seq_id: i for i, seq_id in enumerate(self.seq_ids)}
        rows = [index[s] for s in seq_ids]
        return SelectedProposal(self, rows)

    def _holds(self, i: int) -> bool:
        return self._runner.sequences.get(self.seq_ids[i]) is self._states[i]

    def _settle(self, values: list[list[int]]) -> None:
        for i, (state, fed_at, tokens) in enumerate(zip(self._states, self._fed_at, values)):
            if fed_at is not None and self.k > 1 and self._holds(i):
                self._runner.settle(state, fed_at, tokens[:self.k - 1])
        self._fed_at = [None] * len(self._states)


class SelectedProposal:
    """Some of a chained proposal's sequences, as a started proposal (PendingProposal's face)."""

    draft_s = None  # the scheduler takes the chain's GPU time instead

    def __init__(self, chained: ChainedProposal, rows: list[int]):
        self._chained, self._rows = chained, rows
        tokens = chained._tokens
        if rows != list(range(tokens.shape[0])):
            tokens = tokens[to_device(rows, torch.int64, tokens.device)]
        self.on_device = tokens
        self._response: ProposeResponse | None = None

    def result(self) -> ProposeResponse:
        if self._response is None:
            chained = self._chained
            if not chained.reconciled:
                raise RuntimeError("a chained proposal is reconciled with its verdicts before it is read")
            started = time.perf_counter()
            values = chained._copy.tolist()
            chained._settle(values)
            chained.worker_s += time.perf_counter() - started
            self._response = ProposeResponse(tokens=[values[i] for i in self._rows], compute_s=chained.worker_s)
        return self._response
