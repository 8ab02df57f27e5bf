"""The executor of pipelined speculation: the draft proposes step t + 1 while the target verifies step t.

A speculative step is sequential: the target waits for the draft's tokens, and the draft waits
for the target's verdict. Where the two models have GPUs of their own, that wastes one of them at
any moment. Here each step sends the target its block to verify and, at the same time, asks the
draft to propose *past* that block, as if the target will accept all of it (`ProposeItem.assumed`):

    step t:   target verifies block B_t = (b_1 .. b_m)          [GPU 0]
              draft proposes A = (a_1 .. a_k) after B_t           [GPU 1, meanwhile]

a_1 is the draft's guess of the token the target emits after the block, and a_2 .. a_k the next
block. When the verdict comes back, a sequence's next block is `a_2 .. a_k` if the target accepted
all of B_t and its own next token is a_1: then the draft's tokens were drafted from exactly the
prefix the sequence now has. Otherwise the draft's work for it is wasted (its cache rolls back to
what was committed, a length change) and its next block is a *stand-in*: its last token repeated,
which the target verifies like any proposal (and so accepts only where it is the target's own
token) while the draft proposes from the corrected prefix. Every block has k - 1 tokens, so every
step has one shape and replays the CUDA graphs captured for it.

Lossless as the sequential step is: the target decides every position by its own keyed race
(engine/verification.py), and a proposal only decides how many positions one step covers. So the
text equals the target's own decoding, greedy and seeded, whatever the draft proposed (and
whichever blocks were stand-ins).

Costs: a step takes max(draft's k forwards, verification) instead of their sum; each step verifies
at most k - 1 drafts (the guess a_1 is checked by the verdict, not verified), and a sequence whose
block failed verifies stand-ins for one step. Steady state on two H100s (the 2026-11-27 step costs,
greedy, alpha ~0.93, 8 sequences, k = 3): ~3.1 ms a step for ~2.5 tokens a sequence, against
5.2 ms for ~3.6 in sequence (an estimate; the two-GPU measurement is still to make).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bass.coordinator.sequences import SequenceRun
from bass.core.worker_api import (AddSequence, DraftWorkerAPI, ProposeItem, ProposeRequest, TargetWorkerAPI,
                                  VerifyItem, VerifyRequest, VerifyResponse)


@dataclass
class RoundPlan:
    """One pipelined step as the scheduler planned it."""

    batch: list[SequenceRun]
    drafting: list[int]  # indices into batch of the sequences the draft holds (and proposes for)
    step_started: float
    target_add: list[AddSequence]
    target_release: list[int]
    draft_add: list[AddSequence] = field(default_factory=list)
    draft_release: list[int] = field(default_factory=list)


@dataclass
class RoundOutcome:
    drafts: list[tuple[int, ...]]  # the blocks verified; () where a stand-in was (for the statistics)
    verified: VerifyResponse
    draft_forwards: int
    draft_wait_s: float  # how long the host waited for the draft after the verdicts
    draft_compute_s: float
    verify_s: float
    draft_error: Exception | None = None


@dataclass(frozen=True)
class _Ahead:
    """A proposal made past a block: what it assumed, and what it proposed after."""

    assumed: tuple[int, ...]
    tokens: tuple[int, ...]

    def next_block(self, emitted: list[int]) -> tuple[int, ...] | None:
        """The block this proposal gives the sequence's next step, if the verdict (`emitted`, the
        tokens the target committed) took exactly the path it assumed."""
        if not self.tokens or list(emitted) != [*self.assumed, self.tokens[0]]:
            return None
        return self.tokens[1:]


class PipelinedStep:
    def __init__(self, target: TargetWorkerAPI, draft: DraftWorkerAPI, clock: Callable[[], float], k: int):
        if k < 2:
            raise ValueError(f"a pipelined step drafts k >= 2 tokens ahead, got {k}")
        self.target, self.draft, self.clock, self.k = target, draft, clock, k
        self._blocks: dict[int, tuple[int, ...]] = {}  # by seq_id: the next step's block, where one is valid

    def forget(self, seq_ids) -> None:
        for seq_id in seq_ids:
            self._blocks.pop(seq_id, None)

    def reset(self) -> None:
        """The draft went down or restarted: nothing it proposed stands."""
        self._blocks.clear()

    def execute(self, plan: RoundPlan, rooms: list[int]) -> RoundOutcome:
        """rooms: per sequence, the most drafts its cache still takes after its pending token."""
        batch, k = plan.batch, self.k
        blocks, real = [], []
        for seq, room in zip(batch, rooms):
            block = self._blocks.pop(seq.seq_id, None)
            real.append(block is not None)
            block = block if block is not None else (_last_token(seq),) * (k - 1)
            blocks.append(block[:max(0, room)])
        # The verification first: it runs on the target while the draft proposes below.
        pending = self.target.start_verify(VerifyRequest(
            items=[VerifyItem(s.seq_id, block, s.sampling) for s, block in zip(batch, blocks)],
            add=plan.target_add, release=plan.target_release))
        proposal, error, draft_compute_s = None, None, 0.0
        assumed = [blocks[i] if real[i] else () for i in plan.drafting]
        if plan.drafting or plan.draft_add or plan.draft_release:
            try:
                proposal = self.draft.propose(ProposeRequest(
                    items=[ProposeItem(batch[i].seq_id, k, tuple(batch[i].unsent_to_draft), batch[i].sampling, a)
                           for i, a in zip(plan.drafting, assumed)],
                    add=plan.draft_add, release=plan.draft_release))
            except Exception as exc:  # noqa: BLE001 - speculation is optional; never fail a request for it
                error = exc
            else:
                draft_compute_s = proposal.compute_s
                for i in plan.drafting:
                    batch[i].unsent_to_draft.clear()
        draft_done = self.clock()
        verified = pending.result()
        verify_s = self.clock() - draft_done
        if proposal is not None:
            for i, a, tokens in zip(plan.drafting, assumed, proposal.tokens):
                block = _Ahead(a, tuple(tokens)).next_block(verified.verdicts[i].tokens)
                if block is not None:
                    self._blocks[batch[i].seq_id] = block
        return RoundOutcome(drafts=[b if r else () for b, r in zip(blocks, real)], verified=verified,
                            draft_forwards=k if proposal is not None else 0,
                            draft_wait_s=draft_done - plan.step_started, draft_compute_s=draft_compute_s,
                            verify_s=verify_s, draft_error=error)


def _last_token(seq: SequenceRun) -> int:
    return seq.output[-1] if seq.output else seq.request.prompt_ids[-1]
