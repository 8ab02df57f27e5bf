"""A speculative step over a draft and a target that share one process, as one Speculate call.

The scheduler drives in-process workers on one device through a chain of calls (start_propose,
start_verify(drafts=...), start_chained, then the results): the draft's tokens feed the
verification on the device, and the next step's proposal is queued behind it. These objects
give a remote draft and target in one process (target_service/colocated.py) the same faces, so
the scheduler's code is the same: nothing is sent until the scheduler first waits on a result,
and by then the whole step (proposal, verification, chained proposal) is known and goes as one
Speculate call on the target's session. The worker commits the chained proposal to the verdicts
itself, before it answers, so `reconcile` has nothing left to do here.
"""

from __future__ import annotations

from typing import Sequence

from bass.core.worker_api import ProposeRequest, ProposeResponse, SpeculateRequest, SpeculateResponse, VerifyRequest
from bass.transport import wire


class PairProposal:
    """A proposal not yet sent (RemoteDraftWorker.start_propose, or PairChain.select). Where every
    sequence drafts the same number of tokens, `on_device` is set: the target's start_verify
    takes it and the proposal travels in that Speculate call; else `result` asks the draft's own
    Propose, as for separate services."""

    def __init__(self, draft, request: ProposeRequest | None, chain: "PairChain | None" = None):
        self._draft, self.request, self.chain = draft, request, chain
        self.step: PairStep | None = None  # the Speculate call carrying it, once the target took it
        lengths = {item.num_tokens for item in request.items} if request is not None else {chain.k}
        self.on_device = self if len(lengths) == 1 and min(lengths) >= 1 else None
        self._response: ProposeResponse | None = None
        self.draft_s: float | None = None  # answered with a verification: the draft's time in the worker

    def result(self) -> ProposeResponse:
        if self._response is None:
            if self.step is None:
                if self.request is None:
                    raise RuntimeError("a chained proposal is only read through the verification that took it")
                self._response = self._draft.propose(self.request)
            else:
                answer = self.step.answer()
                if self.chain is not None:
                    self.chain.gpu_s = answer.chained_gpu_s
                self._response = answer.propose
                self.draft_s = answer.propose.compute_s
        return self._response


class PairStep:
    """One Speculate call: built by the target's start_verify, completed by start_chained, sent
    when first waited on (`answer`)."""

    def __init__(self, target, proposal: PairProposal, verify: VerifyRequest):
        if proposal.step is not None:
            raise ValueError("a proposal is verified once")
        proposal.step = self
        self._target, self._proposal, self._verify = target, proposal, verify
        self._chain: ProposeRequest | None = None
        self._call = None
        self._answer: SpeculateResponse | None = None
        self._error: Exception | None = None

    def chain(self, request: ProposeRequest, verified_k: int) -> "PairChain":
        """The next step's proposal behind this one's verification (verified_k: the worker knows
        it from the proposal; DraftWorker.start_chained's signature)."""
        if self._call is not None:
            raise ValueError("the step was sent: its next proposal can no longer be chained behind it")
        self._chain = request
        return PairChain(self, [item.seq_id for item in request.items], request.items[0].num_tokens)

    def send(self) -> None:
        """Send the call now (else the first `answer` does): the scheduler may then send the
        next step's call before reading this one's answer (coordinator/speculative_ahead.py)."""
        if self._call is None:
            request = SpeculateRequest(verify=self._verify, propose=self._proposal.request, chain=self._chain)
            self._call = self._target.start_speculate(wire.speculate_request_to_proto(request))

    def answer(self) -> SpeculateResponse:
        if self._answer is None:
            if self._error is not None:
                raise self._error
            self.send()
            try:
                self._answer = wire.speculate_response_from_proto(self._call.result())
            except Exception as exc:  # every reader of this step gets the same error
                self._error = exc
                raise
        return self._answer

    def discard(self) -> None:
        if self._call is not None and self._answer is None:
            self._call.discard()


class PairPendingVerify:
    """The verification of a PairStep (PendingVerify's face). `verdicts_on_device` is the step
    itself: what the draft's start_chained chains the next proposal on."""

    revised: tuple[int, ...] = ()  # the worker reconciled the chained proposal with the verdicts itself

    def __init__(self, step: PairStep):
        self.verdicts_on_device = step

    def result(self):
        return self.verdicts_on_device.answer().verify

    def send(self) -> None:
        self.verdicts_on_device.send()

    def discard(self) -> None:
        self.verdicts_on_device.discard()


class PairChain:
    """The next step's proposal, chained behind a PairStep (ChainedProposal's face)."""

    def __init__(self, step: PairStep, seq_ids: list[int], k: int):
        self._step, self.seq_ids, self.k = step, seq_ids, k
        self.gpu_s = 0.0  # set from the answer of the step that uses it

    @property
    def queued(self) -> bool:
        """Whether the worker chained it (else the shape was not one it can chain)."""
        return self._step.answer().chained

    def reconcile(self, emitted: Sequence[Sequence[int]], revised: Sequence[int] = ()) -> None:
        """Done by the worker before it answered the step."""

    def select(self, seq_ids: Sequence[int]) -> PairProposal:
        return PairProposal(None, None, chain=self)
