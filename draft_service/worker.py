"""DraftWorker: k autoregressive draft steps for every sequence of the batch at once.

The first forward runs each sequence's pending committed tokens (a ragged batch); each later
forward feeds one token per sequence still drafting. A sampled draft token is the winner of
the target's Gumbel race at that position (same keyed noise) run over the draft's own
distribution, its top-k / top-p cut found among its top-N tokens: nothing but the tokens goes
back, since the verifier only compares them with its own.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from bass.engine.runner import ModelRunner
from bass.engine.sampling import RowParams, draft_race, noise_keys
from bass.engine.transfer import to_device
from bass.errors import InvalidRequestError
from bass.worker_api import ProposeRequest, ProposeResponse, WorkerInfo


class DraftWorker:
    def __init__(self, runner: ModelRunner, top_n: int = 64):
        """top_n: the window of the draft's most likely tokens its top-k / top-p cut is found in."""
        if top_n < 1:
            raise InvalidRequestError("draft_top_n", f"must be >= 1, got {top_n}")
        self.runner = runner
        self.top_n = top_n

    def info(self) -> WorkerInfo:
        return self.runner.info()

    def warm_up(self) -> None:
        """Capture the draft's step shapes: the first forward of a step runs two tokens per
        sequence (see the rewind in _propose), the later ones one; one logit row each."""
        self.runner.warm_up(graph_shapes=[(2, 1), (1, 1)])

    def release(self, seq_ids: Sequence[int]) -> None:
        self.runner.release(seq_ids)

    def reset(self) -> None:
        """Drop every sequence (the coordinator restarted or lost track of this worker)."""
        self.runner.release(list(self.runner.sequences))

    def propose(self, request: ProposeRequest) -> ProposeResponse:
        started = time.perf_counter()
        response = self._propose(request)
        return replace(response, compute_s=time.perf_counter() - started)

    @torch.inference_mode()
    def _propose(self, request: ProposeRequest) -> ProposeResponse:
        runner = self.runner
        runner.release(request.release)
        runner.add(request.add)
        items = list(request.items)
        states = [runner.get(it.seq_id) for it in items]
        for it in items:
            if it.num_tokens < 0:
                raise InvalidRequestError("num_tokens", f"must be >= 0, got {it.num_tokens}")
        for state, it in zip(states, items):
            runner.commit(state, it.committed)
        if runner.graphs is not None:
            # The first draft forward runs each sequence's pending tokens: one after a rejection,
            # two after full acceptance. Re-running one cached token where only one is pending
            # makes the step uniform, so it replays a CUDA graph instead of running eagerly.
            for state, it in zip(states, items):
                if it.num_tokens and runner.pending(state) == 1:
                    runner.rewind(state, 2)

        device = runner.device
        active = [i for i, it in enumerate(items) if it.num_tokens > 0]
        params = RowParams.build([items[i].sampling.params for i in active], device)
        rows = [items[i].num_tokens for i in active]
        steps = max(rows, default=0)
        keys = None
        if not params.all_greedy:
            # Every step's noise keys in one copy: row n, column j is (sequence n, position base + j).
            keys = noise_keys([items[i].sampling.seed_key for i in active for _ in range(steps)],
                              [len(states[i].committed) + j for i in active for j in range(steps)])
            keys = to_device(keys, torch.int64, device).view(len(active), steps)
        # Step j's winners feed step j + 1 straight from the device: the host never waits for a
        # draft token, and copies all of them back once, at the end.
        winners: list[tuple[list[int], torch.Tensor]] = []  # (live sequences, their tokens) per step
        fed_from: dict[int, int] = {}  # sequence -> cache position of its first device-fed token
        for j in range(steps):
            live = [n for n in range(len(active)) if rows[n] > j]
            live_index = None if len(live) == len(active) else to_device(live, torch.int64, device)
            live_states = [states[active[n]] for n in live]
            if j == 0:
                logits = runner.forward([(state, []) for state in live_states], [1] * len(live))
            else:
                for n, state in zip(live, live_states):
                    fed_from.setdefault(n, runner.cached(state))
                prev_live, prev_tokens = winners[-1]
                if len(live) < len(prev_live):  # per-sequence lengths: some stopped drafting
                    keep = to_device([prev_live.index(n) for n in live], torch.int64, device)
                    prev_tokens = prev_tokens[keep]
                logits = runner.forward_fed(live_states, prev_tokens)
            live_params = params if live_index is None else params.take(live_index)
            step_keys = None if keys is None else keys[:, j] if live_index is None else keys[live_index, j]
            tokens = draft_race(logits, live_params, step_keys, self.top_n)
            winners.append((live, tokens))

        drafts: list[list[int]] = [[] for _ in items]
        if winners:
            values = torch.cat([tokens for _, tokens in winners]).tolist()  # the one device-to-host copy
            offset = 0
            for live, _ in winners:
                for n, t in zip(live, values[offset:offset + len(live)]):
                    drafts[active[n]].append(t)
                offset += len(live)
        for n, start in fed_from.items():
            runner.settle(states[active[n]], start, drafts[active[n]][:rows[n] - 1])
        return ProposeResponse(tokens=drafts)
