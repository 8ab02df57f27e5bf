"""The sampled verification tail (LM head, shaping, the keyed race, the accepted prefix, the
packed verdicts) as one function of a step's final hidden states and one staged vector of
host values, so that the target can capture it in a CUDA graph beside the forward.

Eagerly, a sampled step's tail is some sixty small launches and a dozen host-to-device copies
(sampling parameters, noise keys, drafts): on an H100 at batch 64 the host spent longer
queueing them than the GPU spent running the whole step, and sampled regular decoding ran
1.4x slower than greedy for 0.4 ms more GPU work (bench/results, 2026-11-25 evening). Replayed,
it is one launch, fed by one copy.

The function is the eager path's, op for op (`sampling.race_unsynced`, `accept_matching_prefix`),
so both give the same tokens; it only takes its inputs from the staged vector.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from bass.core.config import SamplingParams
from bass.engine.sampling import RowParams, race_unsynced
from bass.engine.verification import verdict_columns

_PARAM_COLUMNS = 7  # temperature, divisor, top_p | top_k, greedy, truncating | noise key


def staged_width(bucket: int, rows_per_seq: int) -> int:
    """Length of the staged vector of a step of `bucket` sequences x `rows_per_seq` rows."""
    return _PARAM_COLUMNS * bucket * rows_per_seq


def stage(params: Sequence[SamplingParams], keys: np.ndarray, bucket: int, rows_per_seq: int) -> np.ndarray:
    """The staged vector (float64, exact for every value it carries) of a step whose rows have
    these parameters and noise keys (one of each per row, sequence-major). Rows past
    len(params) up to `bucket` x `rows_per_seq` are padding: greedy rows whose results are
    dropped. The drafts are not staged: they are the forward's own input tokens."""
    total = bucket * rows_per_seq
    floats, ints = RowParams.columns(list(params))
    out = np.zeros(staged_width(bucket, rows_per_seq), dtype=np.float64)
    columns = out[:_PARAM_COLUMNS * total].reshape(_PARAM_COLUMNS, total)
    columns[1:3] = 1.0  # padding rows: divisor 1, top-p 1 (no cut)
    columns[4] = 1.0  # ... and greedy
    n = len(params)
    columns[0:3, :n] = floats
    columns[3:6, :n] = ints
    columns[6, :n] = keys
    return out


def sampled_verdicts(lm_head, hidden: torch.Tensor, input_ids: torch.Tensor, staged: torch.Tensor, bucket: int,
                     rows_per_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed verdicts [bucket, 1 + rows_per_seq], and redo flags [rows_per_seq] after them
    where the race gives any (not on a GPU), as TargetWorker reads them; the target's token at
    every row [bucket * rows_per_seq])
    of hidden [bucket * rows_per_seq, H], the forward's input tokens [bucket * q] (each
    sequence's last rows_per_seq - 1 are its drafts) and a vector made by `stage`. lm_head:
    hidden -> fp32 logits."""
    total = bucket * rows_per_seq
    k = rows_per_seq - 1
    columns = staged[:_PARAM_COLUMNS * total].view(_PARAM_COLUMNS, total)
    rows = RowParams.from_columns(columns[0:3].float(), columns[3:6].long(), any_greedy=True, any_truncation=True,
                                  max_top_k=0)
    keys = columns[6].long()
    raced, redo = race_unsynced(lm_head(hidden), rows, keys)
    drafts = input_ids.view(bucket, -1)[:, input_ids.numel() // bucket - k:]
    draft_lens = torch.full((bucket,), k, dtype=torch.int64, device=hidden.device)
    return verdict_columns(raced, redo, drafts, draft_lens, [rows_per_seq] * bucket), raced


class SampledVerifyTail:
    """engine/graphs.GraphTail of `sampled_verdicts` over a model's LM head."""

    def __init__(self, lm_head):
        self.lm_head = lm_head

    def width(self, bucket: int, rows: int) -> int:
        return staged_width(bucket, rows)

    def blank(self, bucket: int, rows: int) -> np.ndarray:
        return stage([], np.zeros(0), bucket, rows)

    def __call__(self, hidden: torch.Tensor, input_ids: torch.Tensor, staged: torch.Tensor, bucket: int,
                 rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sampled_verdicts(self.lm_head, hidden, input_ids, staged, bucket, rows)
