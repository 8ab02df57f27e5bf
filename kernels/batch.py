"""The ragged batch: several sequences, each with its own query and context length.

Tokens of all sequences are packed into one dimension (no padding); per-sequence offsets say
where each sequence's queries start. Attention kernels read keys and values from the KV cache
up to each sequence's context length.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class SequenceChunk:
    slot: int
    start: int  # position of the chunk's first token
    tokens: list[int]
    logit_rows: int  # how many of the chunk's last positions need logits


@dataclass(frozen=True)
class RaggedBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    token_slots: torch.Tensor  # [T] int64: KV slot of each token
    token_seq: torch.Tensor  # [T] int64: index of each token's sequence in the batch
    token_offset: torch.Tensor  # [T] int64: index of each token within its chunk
    slots: torch.Tensor  # [B] int64
    q_starts: torch.Tensor  # [B + 1] int64: cumulative query lengths
    q_lens: torch.Tensor  # [B] int64
    ctx_lens: torch.Tensor  # [B] int64: cached length after this step's tokens
    logit_rows: torch.Tensor  # [R] int64: packed-token indices whose logits are returned
    max_q: int
    max_ctx: int
    q_lens_list: list[int]
    ctx_lens_list: list[int]
    slots_list: list[int]
    # ctx_lens_list / max_ctx are only upper bounds, the real lengths being in ctx_lens on the
    # device (a CUDA graph captured once for every context length).
    ctx_lens_are_bounds: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @staticmethod
    def columns(chunks: list[SequenceChunk]) -> dict[str, list[int]]:
        """The batch's vectors as host lists by field name, in the fields' order (input_ids ..
        logit_rows), unchecked: a CUDA graph's static batch fills its buffers from them too."""
        cols: dict[str, list[int]] = {name: [] for name in _VECTORS}
        cols["q_starts"].append(0)
        for b, c in enumerate(chunks):
            n = len(c.tokens)
            base = cols["q_starts"][-1]
            cols["input_ids"].extend(c.tokens)
            cols["positions"].extend(range(c.start, c.start + n))
            cols["token_slots"].extend([c.slot] * n)
            cols["token_seq"].extend([b] * n)
            cols["token_offset"].extend(range(n))
            cols["slots"].append(c.slot)
            cols["q_starts"].append(base + n)
            cols["q_lens"].append(n)
            cols["ctx_lens"].append(c.start + n)
            cols["logit_rows"].extend(range(base + n - c.logit_rows, base + n))
        return cols

    @classmethod
    def build(cls, chunks: list[SequenceChunk], device: torch.device | str) -> "RaggedBatch":
        for c in chunks:
            if not c.tokens:
                raise ValueError(f"sequence in slot {c.slot} has no tokens to run")
            if not 0 <= c.logit_rows <= len(c.tokens):
                raise ValueError(f"logit_rows={c.logit_rows} outside [0, {len(c.tokens)}]")
        cols = cls.columns(chunks)
        q_lens, ctx_lens = cols["q_lens"], cols["ctx_lens"]
        return cls(**{name: torch.tensor(values, dtype=torch.int64, device=device) for name, values in cols.items()},
                   max_q=max(q_lens), max_ctx=max(ctx_lens), q_lens_list=q_lens, ctx_lens_list=ctx_lens,
                   slots_list=cols["slots"])


# RaggedBatch's device vectors, in field order (annotations are strings: `from __future__`).
_VECTORS = tuple(f.name for f in fields(RaggedBatch) if f.type == "torch.Tensor")
