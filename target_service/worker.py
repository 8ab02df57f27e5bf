"""TargetWorker: one ragged forward over [pending tokens, d1..dk] of every sequence, the
target's own token at each of those positions, and per-sequence verification (the longest
matching prefix); the cache keeps exactly the committed prefix afterwards."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from bass.engine.runner import ModelRunner
from bass.engine.sampling import RowParams, noise_keys, race, race_unsynced
from bass.engine.transfer import to_device
from bass.engine.verification import accept_matching_prefix
from bass.worker_api import Verdict, VerifyRequest, VerifyResponse, WorkerInfo


def pad_rows(rows: torch.Tensor, counts: list[int], width: int) -> torch.Tensor:
    """Packed rows [sum(counts), ...] to [len(counts), width, ...], zero-filled; a free view
    when every count equals width (the common case under a batch-level draft length)."""
    if all(c == width for c in counts):
        return rows.view(len(counts), width, *rows.shape[1:])
    out = rows.new_zeros(len(counts), width, *rows.shape[1:])
    seq = [b for b, c in enumerate(counts) for _ in range(c)]
    offset = [j for c in counts for j in range(c)]
    out[to_device(seq, torch.int64, rows.device), to_device(offset, torch.int64, rows.device)] = rows
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
        rows_per_seq = [c + 1 for c in counts]
        # The forward is queued first, and the host prepares the sampling inputs (pinned,
        # asynchronous copies) while the GPU runs it; the one sync is reading the verdicts back.
        logits = runner.forward([(s, list(it.draft_tokens)) for s, it in zip(states, items)], rows_per_seq)
        params = [it.sampling.params for it in items]
        row_params = RowParams.build([p for p, n in zip(params, rows_per_seq) for _ in range(n)], device)
        keys = None
        if not row_params.all_greedy:
            # Row j of sequence b decides the token at position len(committed) + j: every row races
            # with its own keyed noise, so a position is decided the same way whatever k was.
            keys = to_device(noise_keys([it.sampling.seed_key for it, n in zip(items, rows_per_seq) for _ in range(n)],
                                        [len(s.committed) + j for s, n in zip(states, rows_per_seq) for j in range(n)]),
                             torch.int64, device)
        drafts = to_device([list(it.draft_tokens) + [0] * (max_k - len(it.draft_tokens)) for it in items],
                           torch.int64, device).view(len(items), max_k)
        draft_lens = to_device(counts, torch.int64, device)
        raced, redo = race_unsynced(logits, row_params, keys)
        verdicts, redo_rows = self._verdicts(raced, redo, rows_per_seq, max_k, drafts, draft_lens)
        if redo_rows:  # rows whose cut lay outside the window: their exact race, then the verdicts again
            index = to_device(redo_rows, torch.int64, device)
            raced[index] = race(logits[index], row_params.take(index), keys[index])
            verdicts, _ = self._verdicts(raced, None, rows_per_seq, max_k, drafts, draft_lens)
        return self._commit(states, [v[0] for v in verdicts], [v[1:] for v in verdicts])

    @staticmethod
    def _verdicts(raced: torch.Tensor, redo: torch.Tensor | None, rows_per_seq: list[int], max_k: int,
                  drafts: torch.Tensor, draft_lens: torch.Tensor) -> tuple[list[list[int]], list[int]]:
        """[accepted, tokens...] per sequence, and the packed indices of the rows that `redo`
        flags (read back in the same copy)."""
        accepted, tokens = accept_matching_prefix(pad_rows(raced, rows_per_seq, max_k + 1), drafts, draft_lens)
        columns = [accepted[:, None], tokens]
        if redo is not None:
            columns.append(pad_rows(redo.to(torch.int64), rows_per_seq, max_k + 1))
        rows = torch.cat(columns, dim=1).tolist()
        if redo is None:
            return rows, []
        width = max_k + 2  # accepted + max_k + 1 tokens, then the flags
        flagged, offset = [], 0
        for row, n in zip(rows, rows_per_seq):
            flagged += [offset + j for j in range(n) if row[width + j]]
            offset += n
        return [row[:width] for row in rows], flagged

    def _commit(self, states, accepted: list[int], tokens: list[list[int]]) -> VerifyResponse:
        verdicts = []
        for state, a, row in zip(states, accepted, tokens):
            emitted = row[:a + 1]
            self.runner.commit(state, emitted)
            verdicts.append(Verdict(accepted=a, tokens=emitted))
        return VerifyResponse(verdicts=verdicts)
