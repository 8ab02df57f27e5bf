"""Speculative steps sent ahead: over a co-located pair, step t + 1's Speculate call goes out
before step t's answer is read.

Why (#35): at one sequence through the services a speculative step took ~3.7 ms whatever its
GPU work (H200, bench/results/2026-11-28-h200x2-readme-table/, `m3-*`). After the worker
answered step t, the answer crossed to the coordinator, which committed it, planned step t + 1
and sent its call back; only then did the worker stage t + 1's verification, while the GPU, done
with the proposal chained behind t's verification, waited. Sent ahead, t + 1's call is already
in the worker's stream when t is answered: the worker stages it while the chained proposal
runs, and the coordinator commits t while the GPU runs t + 1. (Regular decoding keeps its calls
in flight the same way: coordinator/regular_pipeline.py.)

What t + 1's call cannot know when it is sent, and how each is settled:
- t's verdicts: t + 1 verifies the proposal the worker chained behind t (`use_chained`), which
  ran from those verdicts on the device.
- Whether the worker queued that chain (it declines shapes its graphs do not run): t's answer
  says so. Where it did not, the worker refuses t + 1 before doing any work, and the scheduler
  drops the call and plans t + 1 anew. Steps are sent ahead only of a step that itself runs on a
  chained proposal, so a shape the worker always declines costs no refusal a step.
- Which sequences t finishes: t + 1 verifies them once more and the commit drops their tokens
  (Scheduler._commit). Where t would finish every sequence by its length were all its drafts
  accepted, nothing is sent ahead (the step would be wasted, and the next request waits for it).
- The caches' room: t may commit its drafts, the target's lookup tokens and one more. t + 1 is
  sent only where that and t + 1's own verification fit, and the chain behind it is planned for
  the same worst case (Scheduler._plan_chain's `in_flight`).
- Releases: a call sent ahead carries none (dropped with a refused call, they would be lost);
  they go with the next planned step or when the loop idles.
- Arrivals that fit, and the draft length: nothing is sent ahead while an arrival that fits
  waits; the policy chooses t + 2's length when t + 1 is sent, one step's evidence earlier.
"""

from __future__ import annotations

from bass.coordinator.speculative_step import LaunchedStep, StepPlan
from bass.core.config import MAX_LOOKUP_TAIL


def most_committed(launched: LaunchedStep) -> int:
    """The most tokens a sequence can commit in this step: every draft accepted, then every
    lookup token the target may append after them, then the target's own token."""
    return max(launched.lengths, default=0) + MAX_LOOKUP_TAIL + 1


def plan_ahead(launched: LaunchedStep, max_seq_len: int, step_started: float) -> StepPlan | None:
    """The step after `launched`, on the proposal chained behind it, to send before its answer
    is read; None where it is not to be sent ahead (see the module docstring)."""
    chain = launched.next_chain
    if chain is None or launched.plan.chain is None:
        return None
    batch = [s for s in launched.plan.batch if s.finish_reason is None]
    if not batch:
        return None
    k, drafted = chain.k, max(launched.lengths, default=0)
    if all(len(s.output) + drafted + 1 >= s.request.criteria.max_new_tokens for s in batch):
        return None
    worst = most_committed(launched)
    if any(len(s.request.prompt_ids) + len(s.output) + worst + k + 1 > max_seq_len for s in batch):
        return None
    return StepPlan(batch=batch, lengths=[k] * len(batch), step_started=step_started, chain=chain,
                    target_add=[], target_release=[], sent_ahead=True)
