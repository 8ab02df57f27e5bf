"""The step contract between the coordinator and the two model workers.

These plain dataclasses are what one decoding step sends and receives; the gRPC protos mirror
them. A worker keeps each sequence's state between calls, so a step carries only what changed:
sequences to add (with their prompt), sequences to release, and per sequence the tokens
committed since that worker last heard of it.

Only token ids cross between the models: the draft proposes tokens and the target decides
every position itself (engine/verification.py), so no draft distribution is ever sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from bass.core.config import SamplingParams


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
    # Tokens to propose after as if they were committed: what the draft drafted itself and the
    # target has not verified yet (a draft stream, draft_service/stream.py). The worker forgets
    # them at its next call for the sequence, before it commits what the target decided.
    assumed: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProposeRequest:
    items: Sequence[ProposeItem]
    add: Sequence[AddSequence] = ()
    release: Sequence[int] = ()


@dataclass(frozen=True)
class ProposeResponse:
    tokens: list[list[int]]  # per item, in request order
    compute_s: float = 0.0  # time spent inside the worker (the rest of a call is transport)


@dataclass(frozen=True)
class FollowSequence:
    """A draft stream drafts ahead for this sequence (already added) from now on."""

    seq_id: int
    sampling: SequenceSampling


@dataclass(frozen=True)
class StreamCommit:
    seq_id: int
    tokens: tuple[int, ...]  # what the target committed for the sequence since its last commit


@dataclass(frozen=True)
class StreamControl:
    """Coordinator -> draft stream (coordinator/streamed_step.py). Applied in order: release,
    add, follow, commits. `lookahead` and `chunk` are read from a stream's first message: the
    most tokens the draft runs ahead of what the target committed, and the draft tokens one
    call of its loop runs per sequence (the loop publishes after each call)."""

    add: Sequence[AddSequence] = ()
    follow: Sequence[FollowSequence] = ()
    commits: Sequence[StreamCommit] = ()
    release: Sequence[int] = ()
    lookahead: int = 0
    chunk: int = 0


@dataclass(frozen=True)
class StreamDrafts:
    """Draft stream -> coordinator: tokens the draft drafted for one sequence, in order. Within
    one epoch a sequence's tokens continue each other; the draft starts a new epoch whenever a
    commit disagreed with what it had drafted (it then drafts again from the committed tokens)."""

    seq_id: int
    epoch: int
    position: int  # of tokens[0] in the sequence, its prompt included
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class VerifyItem:
    seq_id: int
    draft_tokens: tuple[int, ...]
    sampling: SequenceSampling


@dataclass(frozen=True)
class VerifyRequest:
    items: Sequence[VerifyItem]
    add: Sequence[AddSequence] = ()
    release: Sequence[int] = ()


@dataclass(frozen=True)
class Verdict:
    accepted: int  # drafts accepted: the draft model's, then any lookup tokens the target appended (lookup_tail)
    tokens: list[int]  # committed this step: accepted drafts then one target token


@dataclass(frozen=True)
class VerifyResponse:
    verdicts: list[Verdict]  # per item, in request order
    compute_s: float = 0.0  # time spent inside the worker
    # Of compute_s, the time blocked on the device's answer (the verdicts' copy to the host): the
    # rest is the worker's host work, which a GPU step must outlast for the GPU not to idle.
    device_wait_s: float = 0.0


@dataclass(frozen=True)
class WorkerInfo:
    model_name: str
    vocab_size: int
    num_slots: int
    max_seq_len: int
    dtype: str
    device: str
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    instance_id: str = ""  # the serving process: a draft and a target with the same id share it


@dataclass(frozen=True)
class SpeculateRequest:
    """A co-located draft and target's whole step (TargetWorker.Speculate in worker.proto)."""

    verify: VerifyRequest  # drafts empty: they are the proposal's, read on the device
    propose: ProposeRequest | None = None  # None: the proposal the last call chained
    chain: ProposeRequest | None = None  # the next step's proposal, queued behind this verification


@dataclass(frozen=True)
class SpeculateResponse:
    propose: ProposeResponse
    verify: VerifyResponse
    chained: bool = False  # `chain` was queued
    chained_gpu_s: float = 0.0  # a chained proposal used: its GPU time


class DraftWorkerAPI(Protocol):
    """Implemented in-process by DraftWorker and over gRPC by RemoteDraftWorker. Remote
    implementations raise WorkerUnavailableError when the worker cannot be reached."""

    def info(self) -> WorkerInfo: ...
    def propose(self, request: ProposeRequest) -> ProposeResponse: ...
    def release(self, seq_ids: Sequence[int]) -> None: ...
    def reset(self) -> None: ...


class DraftStream(Protocol):
    """A draft that runs ahead of the target on its own (DraftWorkerAPI.open_stream): the
    coordinator sends it what the target committed, and collects what it drafted meanwhile."""

    def send(self, control: StreamControl) -> None: ...  # never waits for the draft
    # Everything that arrived since the last call; waits up to timeout_s while nothing has.
    # Raises WorkerUnavailableError once the stream has failed and nothing is left to read.
    def receive(self, timeout_s: float = 0.0) -> list[StreamDrafts]: ...
    def close(self) -> None: ...
    @property
    def busy_s(self) -> float: ...  # the draft's time in its proposals so far, as last reported


class PendingVerify(Protocol):
    def result(self) -> VerifyResponse: ...  # waits for the answer; raises as verify() would
    def discard(self) -> None: ...  # nobody will read the answer


class StartedProposal(Protocol):
    """In-process: a proposal whose tokens are still on the device (`on_device`, [items, k],
    or None where the items draft different lengths) and on their way to the host (`result`)."""

    on_device: object
    # The draft's own time as its worker measured it, where the answer came with the
    # verification (a co-located remote pair, bass/transport/remote_pair.py); None: the host's
    # wait for `result` is its cost.
    draft_s: float | None
    def result(self) -> ProposeResponse: ...


class ChainedProposal(Protocol):
    """In-process: the next step's proposal of k tokens per sequence, queued behind a
    verification before its verdicts reached the host (DraftWorker.start_chained, from the
    target's `PendingVerify.verdicts_on_device`). The caller reconciles it with the verdicts as
    read (the emitted tokens per sequence, and the sequences whose verdicts the target revised
    after the device had them), then selects the sequences the next verification runs."""

    k: int
    seq_ids: list[int]
    queued: bool  # False where the worker declined the shape (a remote pair's worker decides)

    @property
    def gpu_s(self) -> float: ...  # its time on the GPU
    def reconcile(self, emitted: Sequence[Sequence[int]], revised: Sequence[int] = ()) -> None: ...
    def select(self, seq_ids: Sequence[int]) -> StartedProposal: ...


class TargetWorkerAPI(Protocol):
    """A target whose `overlaps_calls` is true (the remote one over its session stream) also
    has `start_verify(request) -> PendingVerify`: regular decoding sends each step's Verify
    before reading the previous one's answer, so the worker never waits on a round trip; its
    `steps_in_flight` (1 if absent) says how many regular steps stay sent and uncommitted after
    each commit.

    In-process, a target whose `verifies_device_drafts` is true takes `start_verify(request,
    drafts=...)`, the draft's tokens still on the device, from a draft worker's
    `start_propose(request)` (its `on_device`, read back by its `result()`); its pending
    call's `verdicts_on_device` is what the draft's `start_chained` queues the next step's
    proposal on. Over gRPC the same calls are made on proxies of a draft and a target that
    share one process (bass/transport/remote_pair.py), and travel as one Speculate call; where
    such a target's `speculates_ahead` is true (the session stream), the scheduler sends the
    next step's call before it reads this one's answer (coordinator/speculative_ahead.py)."""

    def info(self) -> WorkerInfo: ...
    def verify(self, request: VerifyRequest) -> VerifyResponse: ...
    def release(self, seq_ids: Sequence[int]) -> None: ...
    def reset(self) -> None: ...
