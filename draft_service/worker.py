"""DraftWorker: k autoregressive draft steps for every sequence of the batch at once.

The first forward runs each sequence's pending committed tokens (a ragged batch); each later
forward feeds one token per sequence still drafting. Each draft token is sampled from the
compact q (top-N of the shaped draft distribution, computed from each row's top-N logits),
which is returned for the verifier.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from bass.engine.runner import ModelRunner
from bass.engine.sampling import DRAFT_SAMPLE, RowParams, compact_shaped, keyed_uniform, sample_from, seed_key_tensor
from bass.errors import InvalidRequestError
from bass.worker_api import DraftDistributions, ProposeRequest, ProposeResponse, WorkerInfo


class DraftWorker:
    def __init__(self, runner: ModelRunner, top_n: int = 64):
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
            if it.tail_q and it.sampling.params.greedy:
                raise InvalidRequestError("tail_q", "needs temperature > 0")
        for state, it in zip(states, items):
            runner.commit(state, it.committed)
        if runner.graphs is not None:
            # The first draft forward runs each sequence's pending tokens: one after a rejection,
            # two after full acceptance. Re-running one cached token where only one is pending
            # makes the step uniform, so it replays a CUDA graph instead of running eagerly.
            for state, it in zip(states, items):
                if (it.num_tokens or it.tail_q) and runner.pending(state) == 1:
                    runner.rewind(state, 2)

        device = runner.device
        drafts: list[list[int]] = [[] for _ in items]
        active = [i for i, it in enumerate(items) if it.num_tokens > 0 or it.tail_q]
        greedy = all(items[i].sampling.params.greedy for i in active)
        q_steps: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
        # Keyed uniforms are hashed on the host (a few dozen tiny integer ops, bitwise equal to
        # the GPU's) and copied once: launched on the GPU they cost more than the sampling.
        base = torch.tensor([len(states[i].committed) for i in active], dtype=torch.int64)
        keys = seed_key_tensor([items[i].sampling.seed_key for i in active], "cpu")
        params = RowParams.build([items[i].sampling.params for i in active], device)
        rows = [items[i].num_tokens + items[i].tail_q for i in active]
        for j in range(max(rows, default=0)):
            live = [n for n in range(len(active)) if rows[n] > j]
            work = [(states[active[n]], [] if j == 0 else [drafts[active[n]][-1]]) for n in live]
            logits = runner.forward(work, [1] * len(live))
            if greedy:
                tokens = logits.argmax(dim=-1)
            else:
                live_c = torch.tensor(live)
                live_params = params if len(live) == len(active) else params.take(live_c.to(device))
                ids, probs = compact_shaped(logits, live_params, self.top_n)
                u = keyed_uniform(keys[live_c], base[live_c] + j, DRAFT_SAMPLE).to(device, non_blocking=True)
                tokens = ids.gather(-1, sample_from(probs, u)[:, None]).squeeze(-1)
                q_steps.append((live, ids, probs))
            for n, t in zip(live, tokens.tolist()):
                if j < items[active[n]].num_tokens:  # the tail row's token is the verifier's to draw
                    drafts[active[n]].append(t)

        offsets, q = self._gather_q(items, active, q_steps) if not greedy else ([0] * len(items), None)
        return ProposeResponse(tokens=drafts, q=q, q_row_offsets=offsets)

    @staticmethod
    def _gather_q(items, active, q_steps) -> tuple[list[int], DraftDistributions]:
        """Reorder per-step q rows into per-sequence order: item i's rows are contiguous."""
        offsets, row = [0] * len(items), 0
        for i, it in enumerate(items):
            offsets[i] = row
            row += it.num_tokens + it.tail_q
        order = []  # for each step-row (in concatenation order), its destination row
        for j, (live, _, _) in enumerate(q_steps):
            order.extend(offsets[active[n]] + j for n in live)
        ids = torch.cat([s[1] for s in q_steps])
        probs = torch.cat([s[2] for s in q_steps])
        dest = torch.tensor(order, dtype=torch.int64, device=ids.device)
        out_ids = torch.empty_like(ids).index_copy_(0, dest, ids)
        out_probs = torch.empty_like(probs).index_copy_(0, dest, probs)
        return offsets, DraftDistributions(token_ids=out_ids, probs=out_probs)
