"""Where a step's time goes, accumulated over steps (for benchmarks and logs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepStats:
    steps: int = 0
    sequence_steps: int = 0
    committed_tokens: int = 0
    draft_tokens: int = 0  # proposed by the draft
    accepted_tokens: int = 0  # draft tokens the target accepted
    draft_forwards: int = 0  # sequential draft forwards (the longest draft of each step, + tail)
    verify_tokens: int = 0  # tokens the target ran, counting one pending token per sequence
    step_s: float = 0.0  # whole steps, as the coordinator sees them
    # The longest step: a one-off stall (a kernel compiled on first use, a collection) that the
    # mean hides and the round's time shows (H100, 2026-11-27: 0.1-0.3 s steps in 4 ms rounds).
    slowest_step_s: float = 0.0
    draft_s: float = 0.0  # the host's wait for the drafts: Propose calls, transport included (co-located: the Speculate call)
    draft_compute_s: float = 0.0  # inside the draft worker
    verify_s: float = 0.0  # Verify calls, transport included
    verify_compute_s: float = 0.0  # inside the target worker
    # Of verify_compute_s, blocked on the device's answer: the rest is the worker's host work
    # (staging, launches, the commit), which the GPU waits through where it outlasts a step.
    verify_device_wait_s: float = 0.0
    # Steps by the step's draft length (its longest draft; 0 = regular): what a policy such as
    # `auto` chose, probes included, which the means above hide.
    steps_by_length: dict[int, int] = field(default_factory=dict)
    # Streamed speculation (coordinator/streamed_step.py): draft tokens that arrived from the
    # draft stream, those that continued the committed text (the rest had been contradicted on
    # their way), sequence-steps that found no draft to verify, and the draft's time drafting;
    # stand-ins taken from the sequences' own text where drafts were short, and those accepted.
    stream_arrived: int = 0
    stream_kept: int = 0
    stream_starved: int = 0
    stream_draft_busy_s: float = 0.0
    stream_looked_up: int = 0
    stream_lookup_kept: int = 0
    # Lookup tokens a target verified after a step's drafts (engine/lookup_tail.py) that it
    # accepted: the tokens a sequence committed past its drafts, less the target's own last one.
    lookup_tail_kept: int = 0
    # Speculative steps whose proposal was chained behind the verification before them (its
    # draft forwards ran while the host committed that step); the others drafted at their
    # start, on the step's critical path. Of steps_by_length's speculative steps, those not
    # counted here paid for their draft in full.
    chained_steps: int = 0
    # Of those, steps sent before the last step's answer was read (a co-located pair:
    # coordinator/speculative_ahead.py), and steps sent ahead that were dropped unrun (the
    # worker had not queued the chain they were to run on).
    sent_ahead_steps: int = 0
    dropped_ahead_steps: int = 0
    # Per step, when a benchmark asks for it (a list, else None): (draft length, sequences,
    # tokens committed, draft seconds, the Verify call's seconds where the step is timed for the
    # policy, else None (the policy is given the step's whole period less the draft call),
    # each sequence's (seq_id, tokens committed): its own pace, which `auto`'s judgement of a
    # batch's slowest sequence is checked against, clock at the commit's end).
    trace: list[tuple] | None = None

    def add_step(self, seconds: float) -> None:
        self.step_s += seconds
        self.slowest_step_s = max(self.slowest_step_s, seconds)

    def breakdown(self) -> dict:
        """Mean milliseconds per step: draft and verify compute (of which verify_host_ms is the
        target worker's host work, the rest its wait on the device), transport (RPC), and the
        coordinator's own work (scheduling, stop checks, bookkeeping)."""
        n = max(self.steps, 1)
        transport = (self.draft_s - self.draft_compute_s) + (self.verify_s - self.verify_compute_s)
        return {"step_ms": 1000 * self.step_s / n, "draft_ms": 1000 * self.draft_compute_s / n,
                "verify_ms": 1000 * self.verify_compute_s / n,
                "verify_host_ms": 1000 * (self.verify_compute_s - self.verify_device_wait_s) / n,
                "rpc_ms": 1000 * transport / n,
                "coordinator_ms": 1000 * (self.step_s - self.draft_s - self.verify_s) / n}

    def to_dict(self) -> dict:
        return {**asdict(self), "breakdown_ms_per_step": {k: round(v, 4) for k, v in self.breakdown().items()}}
