"""The executor of a speculative step: the draft's proposal, then the target's verification.

The scheduler plans a step (`StepPlan`: which sequences draft how many tokens, what each worker
adds and releases, a proposal already chained behind the last verification) and commits what
`finish` returns (`StepOutcome`). In between, the worker calls run one of two ways, chosen by what
the workers can do, not by a flag:

- **Through the host** (a draft in a process of its own): Propose answers with the tokens, and
  Verify sends them to the target.
- **On the device** (a draft and a target in one process, in-process or co-located behind one
  service): the verification is queued behind the draft's forwards and reads its tokens where
  they are, and the next step's proposal is *chained* behind the verification, so the GPU goes
  from verifying step t to drafting step t + 1 while the host commits step t. The scheduler
  chooses the next step's lengths for that early (`ChainPlanner`). A co-located pair's remote
  faces (coordinator/remote_pair.py) make this one Speculate call.

A step runs in two halves, `start` (queue its work; a co-located pair's call is sent) and
`finish` (read the answers), so that over a co-located pair the scheduler can send the next
step between the two (coordinator/speculative_ahead.py).

Speculation is optional: a draft that fails is reported (`draft_failed`) and the step goes on
as regular decoding, or with the verdicts of drafts the target already read on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from bass.coordinator.sequences import SequenceRun
from bass.core.errors import PreconditionError
from bass.core.worker_api import (AddSequence, ChainedProposal, DraftWorkerAPI, PendingVerify, ProposeRequest,
                                  ProposeResponse, TargetWorkerAPI, VerifyItem, VerifyRequest, VerifyResponse)


@dataclass(frozen=True)
class _Answered:
    """A proposal from a draft that answers at once (over gRPC): nothing on the device."""

    response: ProposeResponse
    on_device = None
    draft_s = None

    def result(self) -> ProposeResponse:
        return self.response


@dataclass
class StepPlan:
    """What one speculative step runs, as the scheduler planned it."""

    batch: list[SequenceRun]
    lengths: list[int]  # draft tokens per sequence of the batch
    step_started: float
    target_add: list[AddSequence]
    target_release: list[int]
    chain: ChainedProposal | None = None  # this step's proposal, chained behind the last verification
    propose: ProposeRequest | None = None  # else a proposal to start, for the sequences in `drafting`
    drafting: list[int] | None = None  # indices into batch
    # Step times feed the draft-length policy only when they are steady-state costs: no prefill
    # of new sequences, and no draft catching up on tokens it skipped (k = 0 steps).
    clean_verify: bool = True
    clean_draft: bool = True
    joined: int = 0  # tokens the draft ran before its proposal (a join), for the policy
    sent_ahead: bool = False  # sent before the last step's answer was read (coordinator/speculative_ahead.py)


@dataclass
class StepOutcome:
    lengths: list[int]  # as planned, or zeros where the draft failed before proposing
    drafts: list[tuple[int, ...]]
    verified: VerifyResponse
    draft_forwards: int
    draft_s: float  # the policy's draft cost
    draft_wait_s: float  # how long the host waited for the drafts (the step statistics)
    draft_compute_s: float
    verify_s: float
    next_chain: ChainedProposal | None  # the next step's proposal, queued behind this verification


@dataclass
class LaunchedStep:
    """A speculative step whose work is queued (SpeculativeStep.start) and whose answers are
    not yet read (`finish`)."""

    plan: StepPlan
    lengths: list[int]  # as planned, or zeros where the draft failed before proposing
    # When the host began on it (the draft's wait is counted from there: in-process on the CPU
    # the work runs as it is queued); a step sent ahead is restamped when its turn comes.
    started: float = 0.0
    drafting: list[int] = field(default_factory=list)  # indices into the batch
    draft_forwards: int = 0
    proposal: object = None  # StartedProposal
    pending: PendingVerify | None = None  # the verification, queued behind the proposal on the device
    next_chain: ChainedProposal | None = None  # the next step's proposal, queued behind the verification

    def discard(self) -> None:
        """Nobody will read this step's answers."""
        if self.pending is not None:
            self.pending.discard()


class ChainRefused(Exception):
    """A co-located pair's worker refused a step on a chained proposal: it had not queued one
    (the step before declined its chain's shape). Nothing ran; the step is to be planned anew."""


class ChainPlanner(Protocol):
    def __call__(self, batch: list[SequenceRun], k: int, tail: int = 0) -> ProposeRequest | None:
        """The next step's proposal, to chain behind a verification of k drafts a sequence (the
        last `tail` of them lookup tokens the target appended); None where the next step runs
        otherwise (new arrivals, lengths that differ, no room)."""


class SpeculativeStep:
    def __init__(self, target: TargetWorkerAPI, draft: DraftWorkerAPI | None, clock: Callable[[], float],
                 draft_failed: Callable[[Exception], None]):
        self.target, self.draft, self.clock, self.draft_failed = target, draft, clock, draft_failed
        # Whether the target verifies the draft's tokens on the device, and whether the draft
        # then chains the next proposal behind it: known once both workers answered Info (the
        # scheduler sets them when the draft connects).
        self.fed_verify = self.chains = bool(getattr(target, "verifies_device_drafts", False))

    def start(self, plan: StepPlan, plan_chain: ChainPlanner) -> LaunchedStep:
        """Queue the step's work (in-process: on the device; a co-located pair: its Speculate
        call is sent) without waiting for any of it."""
        batch, lengths = plan.batch, list(plan.lengths)
        launched = LaunchedStep(plan=plan, lengths=lengths, started=self.clock())
        if plan.chain is not None:
            launched.drafting, launched.draft_forwards = list(range(len(batch))), plan.chain.k
            launched.proposal = plan.chain.select([s.seq_id for s in batch])
        elif plan.propose is not None:
            launched.drafting, launched.draft_forwards = plan.drafting, max(lengths, default=0)
            try:
                launched.proposal = self._start_propose(plan.propose)
            except Exception as exc:  # noqa: BLE001 - speculation is optional; never fail a request for it
                self.draft_failed(exc)
                launched.lengths, launched.draft_forwards = [0] * len(batch), 0
        proposal = launched.proposal
        on_device = proposal.on_device if proposal is not None and len(launched.drafting) == len(batch) else None
        if on_device is not None:
            # Verification is queued behind the draft's forwards and reads its tokens on the
            # device; the host reads them back while the target runs.
            launched.pending = self.target.start_verify(VerifyRequest(
                items=[VerifyItem(s.seq_id, (), s.sampling) for s in batch],
                add=plan.target_add, release=plan.target_release), drafts=on_device)
            launched.next_chain = self._chain_next(batch, max(launched.lengths), launched.pending, plan_chain)
            send = getattr(launched.pending, "send", None)  # a co-located pair's call: on its way now
            if send is not None:
                send()
        return launched

    def finish(self, launched: LaunchedStep) -> StepOutcome:
        """Wait for the step's answers. Raises ChainRefused where a co-located pair's worker
        refused a step sent ahead on a chained proposal it had not queued."""
        plan, batch, lengths = launched.plan, launched.plan.batch, launched.lengths
        proposal, pending, next_chain = launched.proposal, launched.pending, launched.next_chain
        drafts: list[tuple[int, ...]] = [()] * len(batch)
        draft_forwards, draft_s, draft_wait_s, draft_compute_s = launched.draft_forwards, 0.0, 0.0, 0.0
        started = launched.started
        if proposal is not None:
            try:
                response = proposal.result()
            except Exception as exc:  # noqa: BLE001
                if plan.sent_ahead and isinstance(exc, PreconditionError):
                    raise ChainRefused(str(exc)) from exc
                self.draft_failed(exc)
                next_chain = None
                if pending is None:
                    lengths, draft_forwards = [0] * len(batch), 0
                else:  # verified from the device: its verdicts stand; the drafts' lengths are known
                    drafts = [(0,) * k for k in lengths]
            else:
                # The policy's draft cost. A chained proposal ran on the GPU while the host
                # committed the last step: its cost is its GPU time, not the host's wait for it.
                # A co-located remote draft answers with the verification (one call): its own
                # time is what the worker measured (`draft_s`), not the wait for the call.
                draft_wait_s = self.clock() - started
                draft_s = (plan.chain.gpu_s if plan.chain is not None
                           else proposal.draft_s if proposal.draft_s is not None else draft_wait_s)
                draft_compute_s = response.compute_s
                for n, i in enumerate(launched.drafting):
                    batch[i].unsent_to_draft.clear()
                    drafts[i] = tuple(response.tokens[n])
        started = self.clock()
        if pending is not None:
            verified = pending.result()
        else:
            verified = self.target.verify(VerifyRequest(
                items=[VerifyItem(s.seq_id, drafts[i], s.sampling) for i, s in enumerate(batch)],
                add=plan.target_add, release=plan.target_release))
        verify_s = self.clock() - started
        if next_chain is not None:
            # What the chained proposal ran, now that the host has the verdicts it ran from.
            next_chain.reconcile([v.tokens for v in verified.verdicts], pending.revised)
        return StepOutcome(lengths=lengths, drafts=drafts, verified=verified, draft_forwards=draft_forwards,
                           draft_s=draft_s, draft_wait_s=draft_wait_s, draft_compute_s=draft_compute_s,
                           verify_s=verify_s, next_chain=next_chain)

    def _start_propose(self, request: ProposeRequest):
        """The draft's proposal, started (in-process: still on the device) or already answered."""
        start = getattr(self.draft, "start_propose", None) if self.fed_verify else None
        return start(request) if start is not None else _Answered(self.draft.propose(request))

    def _chain_next(self, batch: list[SequenceRun], k: int, pending: PendingVerify,
                    plan_chain: ChainPlanner) -> ChainedProposal | None:
        """Queue the next step's proposal behind this verification (DraftWorker.start_chained),
        so that the GPU drafts step t + 1 while the host commits step t; None where the next
        step runs otherwise."""
        start = getattr(self.draft, "start_chained", None) if self.chains else None
        verdicts = getattr(pending, "verdicts_on_device", None)
        if start is None or verdicts is None:
            return None
        tail = getattr(pending, "tail", 0)  # lookup tokens the target verified after the k drafts
        request = plan_chain(batch, k + tail, tail)
        if request is None:
            return None
        try:
            return start(request, verdicts, k + tail, tail)
        except Exception as exc:  # noqa: BLE001 - speculation is optional; never fail a request for it
            self.draft_failed(exc)
            return None
