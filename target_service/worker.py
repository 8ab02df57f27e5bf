"""TargetWorker: one ragged forward over [pending tokens, d1..dk] of every sequence, then
per-sequence verification; the cache keeps exactly the committed prefix afterwards."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from bass.engine.runner import ModelRunner
from bass.engine.sampling import (ACCEPT_TEST, DRAFT_SAMPLE, TARGET_SAMPLE, RowParams, keyed_uniform, sample_from,
                                  seed_key_tensor, shape_probs)
from bass.engine.verification import verify_drafts, verify_greedy
from bass.errors import InvalidRequestError
from bass.worker_api import DraftDistributions, Verdict, VerifyRequest, VerifyResponse, WorkerInfo


def pad_rows(rows: torch.Tensor, counts: list[int], width: int) -> torch.Tensor:
    """Packed rows [sum(counts), ...] to [len(counts), width, ...], zero-filled; a free view
    when every count equals width (the common case under a batch-level draft length)."""
    if all(c == width for c in counts):
        return rows.view(len(counts), width, *rows.shape[1:])
    out = rows.new_zeros(len(counts), width, *rows.shape[1:])
    seq = [b for b, c in enumerate(counts) for _ in range(c)]
    offset = [j for c in counts for j in range(c)]
    out[torch.tensor(seq, device=rows.device), torch.tensor(offset, device=rows.device)] = rows
    return out


class TargetWorker:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def info(self) -> WorkerInfo:
        return self.runner.info()

    def warm_up(self) -> None:
        """Capture verification shapes: the pending token plus k drafts, k + 1 logit rows, for
        k = 0 (regular decoding) to graph_max_draft."""
        self.runner.warm_up(graph_shapes=[(k + 1, k + 1) for k in range(self.runner.config.graph_max_draft + 1)])

    def release(self, seq_ids: Sequence[int]) -> None:
        self.runner.release(seq_ids)

    def reset(self) -> None:
        """Drop every sequence (the coordinator restarted or lost track of this worker)."""
        self.runner.release(list(self.runner.sequences))

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        started = time.perf_counter()
        response = self._verify(request)
        return replace(response, compute_s=time.perf_counter() - started)

    @torch.inference_mode()
    def _verify(self, request: VerifyRequest) -> VerifyResponse:
        runner = self.runner
        runner.release(request.release)
        runner.add(request.add)
        items = list(request.items)
        if not items:
            return VerifyResponse(verdicts=[])
        states = [runner.get(it.seq_id) for it in items]
        device = runner.device
        counts = [len(it.draft_tokens) for it in items]
        max_k = max(counts)
        params = [it.sampling.params for it in items]
        if request.q is None and not all(p.greedy for p in params) and max_k > 0:
            raise InvalidRequestError("q", "sampled (temperature > 0) sequences need the draft's q")
        base = [len(s.committed) for s in states]

        logits = runner.forward([(s, list(it.draft_tokens)) for s, it in zip(states, items)],
                                [c + 1 for c in counts])
        drafts = torch.tensor([list(it.draft_tokens) + [0] * (max_k - len(it.draft_tokens)) for it in items],
                              dtype=torch.int64, device=device).view(len(items), max_k)
        draft_lens = torch.tensor(counts, dtype=torch.int64, device=device)
        rows_per_seq = [c + 1 for c in counts]
        if all(p.greedy for p in params):
            argmax = pad_rows(logits.argmax(dim=-1), rows_per_seq, max_k + 1)
            accepted, tokens = verify_greedy(argmax, drafts, draft_lens)
            return self._commit(states, accepted.tolist(), tokens.tolist(), counts)

        # Sequences with a tail q row get one more, virtual, draft token at position k: drawn
        # here from that row with the draft's own keyed uniform, so the position is decided
        # exactly as if the draft had proposed it (no bonus token after it).
        tails = [int(it.tail_q) for it in items]
        ext_lens = [c + t for c, t in zip(counts, tails)]
        width = max(ext_lens)
        row_params = RowParams.build([p for p, n in zip(params, rows_per_seq) for _ in range(n)], device)
        p = pad_rows(shape_probs(logits, row_params), rows_per_seq, width + 1)
        q_ids, q_probs = self._draft_q(request.q, items, ext_lens, width, device)
        # Keyed uniforms are hashed on the host (bitwise equal to the GPU's) and copied once:
        # as GPU ops, their few dozen tiny launches cost more than the verification math.
        keys = seed_key_tensor([it.sampling.seed_key for it in items], "cpu")[:, None]
        positions = torch.tensor(base, dtype=torch.int64)[:, None] + torch.arange(width + 1)[None, :]
        ext_drafts = torch.cat([drafts, drafts.new_zeros(len(items), width - max_k)], dim=1)
        if any(tails):
            rows_c = torch.tensor([b for b, t in enumerate(tails) if t])
            at_c = torch.tensor([counts[b] for b, t in enumerate(tails) if t])
            u = keyed_uniform(keys[rows_c, 0], positions[rows_c, at_c], DRAFT_SAMPLE).to(device, non_blocking=True)
            rows, at = rows_c.to(device), at_c.to(device)
            pick = sample_from(q_probs[rows, at], u)
            ext_drafts[rows, at] = q_ids[rows, at].gather(-1, pick[:, None]).squeeze(-1)
        accept_u = keyed_uniform(keys, positions[:, :width], ACCEPT_TEST).to(device, non_blocking=True)
        sample_u = keyed_uniform(keys, positions, TARGET_SAMPLE).to(device, non_blocking=True)
        accepted, tokens = verify_drafts(p, ext_drafts, torch.tensor(ext_lens, device=device), q_ids, q_probs,
                                         accept_u, sample_u)
        return self._commit(states, accepted.tolist(), tokens.tolist(), counts)

    def _commit(self, states, accepted: list[int], tokens: list[list[int]], counts: list[int]) -> VerifyResponse:
        verdicts = []
        for state, a, row, k in zip(states, accepted, tokens, counts):
            # a == k + 1 only when a virtual tail draft was accepted: it is the last token.
            emitted = row[:min(a + 1, k + 1)]
            self.runner.commit(state, emitted)
            verdicts.append(Verdict(accepted=min(a, k), tokens=emitted))
        return VerifyResponse(verdicts=verdicts)

    @staticmethod
    def _draft_q(q: DraftDistributions | None, items, lens: list[int], width: int,
                 device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sequence compact q as [B, width, N] (lens[b] rows for sequence b); one-hot on the
        draft token where none was sent (greedy drafts)."""
        if q is None:
            drafts = torch.tensor([list(it.draft_tokens) + [0] * (width - len(it.draft_tokens)) for it in items],
                                  dtype=torch.int64, device=device).view(len(items), width)
            return drafts[..., None], torch.ones(len(items), width, 1, device=device)
        num_rows = q.token_ids.shape[0]
        for it, n in zip(items, lens):
            if n and not 0 <= it.q_row_offset <= num_rows - n:
                raise InvalidRequestError(
                    "q_row_offset", f"sequence {it.seq_id}: rows {it.q_row_offset}..{it.q_row_offset + n}"
                    f" outside the {num_rows} rows of q")
        offsets = torch.tensor([it.q_row_offset for it in items], dtype=torch.int64, device=device)
        j = torch.arange(width, device=device)[None, :]
        valid = j < torch.tensor(lens, dtype=torch.int64, device=device)[:, None]
        index = torch.where(valid, offsets[:, None] + j, torch.zeros_like(j))
        ids = q.token_ids.to(device)[index]
        probs = q.probs.to(device)[index] * valid[..., None]
        return ids, probs
