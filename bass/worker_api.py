"""The step contract between the coordinator and the two model workers.

These plain dataclasses are what one decoding step sends and receives; the gRPC protos mirror
them. A worker keeps each sequence's state between calls, so a step carries only what changed:
sequences to add (with their prompt), sequences to release, and per sequence the tokens
committed since that worker last heard of it.

The coordinator never looks inside `DraftDistributions`: it forwards the draft's compact q from
`Propose` to `Verify` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

from bass.config import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AddSequence:
    """Start a sequence. With `parent_id`, fork it from that (already added) sequence instead:
    n samples of one prompt share one prefill."""

    seq_id: int
    prompt_ids: tuple[int, ...] = ()
    parent_id: int | None = None


@dataclass(frozen=True)
class SequenceSampling:
    """Per-sequence sampling settings plus the key its randomness is drawn from.

    Uniforms are a pure function of (seed_key, position, purpose), so a seeded sequence draws
    the same randomness whatever else is in the batch.
    """

    params: SamplingParams
    seed_key: int


@dataclass(frozen=True)
class ProposeItem:
    seq_id: int
    num_tokens: int
    committed: tuple[int, ...]  # tokens committed since this worker last saw this sequence
    sampling: SequenceSampling
    # Also return q for the position after the last draft token (one more draft forward). The
    # verifier then decides that position by the same draft-accept-or-resample rule as every
    # other, so a seeded sequence's text does not depend on its draft length.
    tail_q: bool = False


@dataclass(frozen=True)
class ProposeRequest:
    items: Sequence[ProposeItem]
    add: Sequence[AddSequence] = ()
    release: Sequence[int] = ()


@dataclass
class DraftDistributions:
    """The compact q of every proposed token: row r holds the top-N token ids and their
    renormalized probabilities under which draft token r was sampled. Rows follow the order of
    the proposals, `num_tokens` rows per sequence (+1 with tail_q)."""

    token_ids: "torch.Tensor"  # [rows, N] int64
    probs: "torch.Tensor"  # [rows, N] float32


@dataclass(frozen=True)
class ProposeResponse:
    tokens: list[list[int]]  # per item, in request order
    q: DraftDistributions | None
    q_row_offsets: list[int]  # per item: first row of its q in `q`
    compute_s: float = 0.0  # time spent inside the worker (the rest of a call is transport)


@dataclass(frozen=True)
class VerifyItem:
    seq_id: int
    draft_tokens: tuple[int, ...]
    sampling: SequenceSampling
    q_row_offset: int = 0  # first row of this item's q in the request's `q`
    tail_q: bool = False  # q holds one row more than draft_tokens (see ProposeItem.tail_q)


@dataclass(frozen=True)
class VerifyRequest:
    items: Sequence[VerifyItem]
    q: DraftDistributions | None = None
    add: Sequence[AddSequence] = ()
    release: Sequence[int] = ()


@dataclass(frozen=True)
class Verdict:
    accepted: int  # draft tokens (proposed by the draft model) accepted
    tokens: list[int]  # committed this step: accepted drafts then one target token


@dataclass(frozen=True)
class VerifyResponse:
    verdicts: list[Verdict]  # per item, in request order
    compute_s: float = 0.0  # time spent inside the worker


@dataclass(frozen=True)
class WorkerInfo:
    model_name: str
    vocab_size: int
    num_slots: int
    max_seq_len: int
    dtype: str
    device: str
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)


class DraftWorkerAPI(Protocol):
    """Implemented in-process by DraftWorker and over gRPC by RemoteDraftWorker. Remote
    implementations raise WorkerUnavailableError when the worker cannot be reached."""

    def info(self) -> WorkerInfo: ...
    def propose(self, request: ProposeRequest) -> ProposeResponse: ...
    def release(self, seq_ids: Sequence[int]) -> None: ...
    def reset(self) -> None: ...


class TargetWorkerAPI(Protocol):
    def info(self) -> WorkerInfo: ...
    def verify(self, request: VerifyRequest) -> VerifyResponse: ...
    def release(self, seq_ids: Sequence[int]) -> None: ...
    def reset(self) -> None: ...
