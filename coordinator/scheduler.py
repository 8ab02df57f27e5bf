"""The step loop: admit requests, pick draft lengths, Propose, Verify, commit, stop.

One `step()` is one BASS step for every running sequence. New requests join between steps
(continuous batching) while KV slots and the batch limit allow; finished sequences leave and
their slots are released with the next call to each worker.

Failures: if the draft worker fails, sequences carry on with regular decoding and the draft
is probed every `reconnect_interval_s`; once it answers it is reset and running sequences
rejoin it as they draft again. A target failure propagates (WorkerUnavailableError) to the
caller, which fails the affected requests (`fail_all`).

Not thread-safe: one thread runs the loop (see coordinator/engine.py); `prepare` alone may be
called from other threads.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import statistics
import sys
import time
from collections import deque
from typing import Callable, Iterable

from bass.coordinator import speculative_ahead
from bass.coordinator.draft_length import Join, make_policy
from bass.coordinator.incremental_text import IncrementalText
from bass.coordinator.regular_pipeline import Answered, PairedPeriods, RegularPipeline
from bass.coordinator.requests import FinishReason, GenerationRequest, GenerationResult, SequenceOutput
from bass.coordinator.sequences import PrefillBudget, RequestRun, SequenceRun, sequence_seed_key
from bass.coordinator.speculative_step import ChainRefused, LaunchedStep, SpeculativeStep, StepOutcome, StepPlan
from bass.coordinator.step_stats import StepStats
from bass.coordinator.streamed_step import StreamedStep, StreamPlan
from bass.coordinator.stopping import StopCriteria, check_stop
from bass.coordinator.tokenizer import Codec
from bass.core.config import SchedulerConfig, same_device
from bass.core.errors import InvalidRequestError, WorkerUnavailableError
from bass.core.worker_api import (AddSequence, DraftWorkerAPI, ProposeItem, ProposeRequest, SequenceSampling,
                                  StreamControl, TargetWorkerAPI, VerifyResponse)

log = logging.getLogger(__name__)

# Tokens a drafting sequence's first forward runs anyway (the last step's one or two: the draft
# worker's FIRST_STEP_TOKENS); more are a catch-up the policy counts as a join.
_STEADY_PENDING = 2


class Scheduler:
    def __init__(self, target: TargetWorkerAPI, draft: DraftWorkerAPI | None, codec: Codec,
                 config: SchedulerConfig = SchedulerConfig(), *, reconnect_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.perf_counter):
        self._target, self._draft, self.codec, self.config = target, draft, codec, config
        self.clock = clock
        self.reconnect_interval_s = reconnect_interval_s
        self.target_info = target.info()
        self.slot_capacity = self.target_info.num_slots
        self.max_seq_len = self.target_info.max_seq_len
        # Regular decoding over a target that overlaps calls keeps steps in flight: as many
        # after each commit as the target asks for (TargetWorkerAPI.steps_in_flight).
        self._overlaps = bool(getattr(target, "overlaps_calls", False))
        self._depth = max(1, int(getattr(target, "steps_in_flight", 1))) if self._overlaps else 1
        self.policy = self._new_policy()
        # The executors: regular steps kept in flight, and speculative steps.
        self.regular = RegularPipeline(target, self._depth, clock)
        self._regular_prices = PairedPeriods()  # what the policy is told a regular step costs
        self.speculative = SpeculativeStep(target, draft, clock, self._draft_failed)
        stream = config.draft_stream
        self.streamed = (StreamedStep(target, clock, stream.block, stream.wait_ms / 1000, lookup=stream.lookup)
                         if stream.on and draft is not None else None)
        self.wants_draft = draft is not None and (config.draft_length.speculates or self.streamed is not None)
        self.draft_up = False
        self._next_probe = 0.0
        if self.wants_draft:
            self._connect_draft()
        self.waiting: deque[RequestRun] = deque()
        self.running: list[SequenceRun] = []
        self._seq_ids = itertools.count(1)
        self._slots_held = 0  # running sequences plus finished ones not yet released
        self._target_add: list[AddSequence] = []
        self._draft_add: list[AddSequence] = []
        self._target_release: list[int] = []
        self._draft_release: list[int] = []
        self._drafted_last_step = False  # else the draft catches up on skipped tokens first
        # The last step's draft length (0: regular or none): a speculative step's time is a
        # steady cost of its length only where the step before drafted the same length.
        self._last_length = 0
        self._chain = None  # the proposal chained behind the last step's verification, for this step
        self._ahead: LaunchedStep | None = None  # a speculative step sent before the last one's commit
        self._decided: dict[int, int] | None = None  # the policy's lengths for this step, asked early
        self._uncounted_step_s = 0.0  # a pipelined step that committed nothing: counted with the next
        self._last_step_end: float | None = None  # clock() when the last step() returned
        self.step_stats = StepStats()

    # The workers, shared with the executors: a caller may wrap one after construction (tests and
    # benchmarks count or delay its calls), and the executors then call the wrapper too.
    @property
    def target(self) -> TargetWorkerAPI:
        return self._target

    @target.setter
    def target(self, worker: TargetWorkerAPI) -> None:
        self._target = self.regular.target = self.speculative.target = worker
        if self.streamed is not None:
            self.streamed.target = worker

    @property
    def draft(self) -> DraftWorkerAPI | None:
        return self._draft

    @draft.setter
    def draft(self, worker: DraftWorkerAPI | None) -> None:
        self._draft = self.speculative.draft = worker

    def _new_policy(self):
        """A draft-length policy that knows nothing yet, timed for this scheduler's regular steps
        in flight."""
        return make_policy(self.config.draft_length, regular_steps_in_flight=self._depth)

    # -- requests ---------------------------------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> RequestRun:
        """Validate and tokenize a request (safe to call from any thread)."""
        cfg = self.config
        if request.n > cfg.max_n:
            raise InvalidRequestError("n", f"{request.n} exceeds the limit of {cfg.max_n}")
        fits = min(self.slot_capacity, cfg.max_batch_size)
        if request.n > fits:
            raise InvalidRequestError("n", f"{request.n} sequences can never fit: the batch holds at most {fits}")
        if request.max_new_tokens > cfg.max_new_tokens:
            raise InvalidRequestError("max_new_tokens",
                                      f"{request.max_new_tokens} exceeds the limit of {cfg.max_new_tokens}")
        prompt_ids = list(request.prompt_ids) if request.prompt_ids is not None else self.codec.encode(request.prompt)
        if not prompt_ids:
            raise InvalidRequestError("prompt", "encodes to no tokens")
        vocab = self.target_info.vocab_size
        if any(t >= vocab for t in prompt_ids):
            raise InvalidRequestError("prompt_ids", f"token ids must be < vocabulary size {vocab}")
        if len(prompt_ids) + request.max_new_tokens > self.max_seq_len:
            raise InvalidRequestError(
                "max_new_tokens", f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({request.max_new_tokens}) "
                                  f"exceeds max_seq_len {self.max_seq_len}")
        stop_ids = set(request.stop_token_ids)
        if not request.ignore_eos:
            stop_ids.update(self.target_info.eos_token_ids)
        run = RequestRun(request=request, prompt_ids=prompt_ids, submitted=self.clock(),
                         criteria=StopCriteria(frozenset(stop_ids), request.stop, request.max_new_tokens))
        seed = request.seed if request.seed is not None else secrets.randbits(64)
        for index in range(request.first_index, request.first_index + request.n):
            run.sequences.append(SequenceRun(
                seq_id=next(self._seq_ids), index=index, request=run,
                sampling=SequenceSampling(request.sampling, sequence_seed_key(seed, index)),
                text=IncrementalText(self.codec.decode)))
        return run

    def enqueue(self, run: RequestRun) -> None:
        self.waiting.append(run)

    def submit(self, request: GenerationRequest) -> RequestRun:
        run = self.prepare(request)
        self.enqueue(run)
        return run

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.regular.in_flight or self._ahead is not None)

    def generate(self, requests: Iterable[GenerationRequest]) -> list[GenerationResult]:
        """Run requests to completion in-process (all batched together); results in order."""
        runs = [self.submit(r) for r in requests]
        while self.has_work:
            self.step()
        self.flush_releases()
        return [r.result for r in runs]

    def cancel(self, run: RequestRun) -> None:
        """Drop a request (the client went away): its sequences stop and their slots are freed."""
        if run in self.waiting:
            self.waiting.remove(run)
            return
        for seq in run.sequences:
            if seq.finish_reason is None:
                self._finish_sequence(seq, FinishReason.CANCELLED)
        self.running = [s for s in self.running if s.finish_reason is None]

    def fail_all(self) -> list[RequestRun]:
        """Forget every request (after a target failure); returns them so the caller can
        answer each with an error. The caller must reset both workers (a new Scheduler does)
        before admitting new work."""
        failed = list(self.waiting) + list({id(s.request): s.request for s in self.running}.values())
        self.waiting.clear()
        self.running = []
        self._slots_held = 0
        self.regular.discard()
        if self._ahead is not None:
            self._ahead.discard()
        self._chain, self._decided, self._ahead = None, None, None  # the workers are reset before new work
        self.close()
        self._target_add, self._draft_add, self._target_release, self._draft_release = [], [], [], []
        self.policy = self._new_policy()
        return failed

    def close(self) -> None:
        """Stop what runs on its own beside the loop (a draft stream); the scheduler is done."""
        if self.streamed is not None:
            self.streamed.close()

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestRun]:
        """One speculative step for the whole batch; returns the requests that finished
        (each exactly once). Raises WorkerUnavailableError if the target fails."""
        if not self.running and not self.regular.in_flight and self._ahead is None:
            self._last_step_end = None  # idle before this step: no period to time
        finished = self._step()
        self._last_step_end = self.clock()
        return finished

    def _period(self) -> float | None:
        """Seconds since the previous step ended: what one step costs the loop in all (the
        coordinator's own work included), where the steps ran back to back."""
        return None if self._last_step_end is None else self.clock() - self._last_step_end

    def _step(self) -> list[RequestRun]:
        """Plan the step, run it on the workers (one of the executors), commit its verdicts."""
        finished = self._expire_budgets()
        if self._ahead is not None:  # sent during the last step: commit it (and send the next)
            launched, self._ahead = self._ahead, None
            launched.plan.step_started = launched.started = self.clock()
            return finished + self._speculate(launched)
        # The budget protects running sequences from an arrival's prefill. With none running,
        # nobody waits on admission, so the first wave of a burst is admitted whole; the draft's
        # prefill (which delays those new sequences' first tokens) keeps to the budget.
        limit = self.config.max_prefill_tokens_per_step
        prefill = PrefillBudget(limit if self.running else sys.maxsize)
        # A proposal chained behind the last verification already runs this step's drafts for
        # the last step's sequences; arrivals join the step after (_plan_chain saw none waiting).
        chain, self._chain = self._chain, None
        if chain is not None and not (self.draft_up and self.running):
            chain = None  # every sequence left (cancelled, out of time), or the draft went down
        if chain is None:
            self._admit(prefill)
        if prefill.limit != limit:
            prefill = PrefillBudget(limit, used=prefill.used)
        if self.regular.in_flight and not self.running:
            finished += self._drain_in_flight()
        if not self.running:
            return finished
        batch = self.running
        if self.streamed is not None:
            if self.draft_up and len(batch) <= self.config.draft_stream.max_batch:
                return finished + self._streamed_step(prefill)
            self._leave_stream(batch)
            wanted = {s.seq_id: 0 for s in batch}  # regular decoding meanwhile
        else:
            wanted = self._wanted_lengths(batch) if chain is None else {s.seq_id: chain.k for s in batch}
        if self._overlaps and not any(wanted.values()) and not self._draft_add:
            # Regular decoding (the policy's choice, or no draft). Releases for the draft wait
            # for its next call, or for the loop to go idle (flush_releases).
            return finished + self._regular_step()
        if self.regular.in_flight:
            # Speculation resumes: the regular steps in flight are committed first, so that the
            # sequences joining the draft bring all their tokens and none that finished joins.
            finished += self._drain_in_flight()
            batch = self.running
            if not batch:
                return finished
        self._attach_where_wanted(batch, wanted, prefill)
        plan = self._plan_speculative(batch, wanted, chain)
        return finished + self._speculate(self.speculative.start(plan, self._plan_chain))

    def _speculate(self, launched: LaunchedStep) -> list[RequestRun]:
        """Read a speculative step's answers and commit them. Over a co-located pair the next
        step, on the proposal chained behind this one, is sent first where it may be
        (coordinator/speculative_ahead.py): the worker finds it waiting when it answers this one."""
        ahead = self._send_ahead(launched)
        try:
            outcome = self.speculative.finish(launched)
        except BaseException as exc:  # nobody reads the step sent ahead of a step that did not run
            if ahead is not None:
                ahead.discard()
            if not isinstance(exc, ChainRefused):
                raise  # the target failed: the caller fails the requests
            log.debug("a step sent ahead was refused: %s", exc)  # nothing ran; the next step is planned anew
            self.step_stats.dropped_ahead_steps += 1 + (ahead is not None)
            return []
        finished = self._commit_speculative(launched.plan, outcome)
        if ahead is not None:
            if self._chain is not None:  # the worker queued the chain: the step sent ahead runs on it
                self._chain, self._ahead = None, ahead
            else:  # it did not (or the draft failed): the worker refuses that step, which is dropped
                ahead.discard()
                self.step_stats.dropped_ahead_steps += 1
        return finished

    def _send_ahead(self, launched: LaunchedStep) -> LaunchedStep | None:
        """Start the step after `launched` before its answer is read, or None."""
        if (not getattr(self.target, "speculates_ahead", False) or not self.speculative.chains
                or not self.draft_up or self._fits_waiting()):
            return None
        plan = speculative_ahead.plan_ahead(launched, self.max_seq_len, self.clock())
        if plan is None:
            return None
        plan_chain = functools.partial(self._plan_chain, in_flight=speculative_ahead.most_committed(launched))
        return self.speculative.start(plan, plan_chain)

    def _plan_speculative(self, batch: list[SequenceRun], wanted: dict[int, int], chain) -> StepPlan:
        """The step's lengths, the proposal to start (unless one is chained) and what each
        worker adds and releases with it (taken from the scheduler's lists)."""
        lengths = self._capped_lengths(batch, wanted)
        plan = StepPlan(batch=batch, lengths=lengths, step_started=self.clock(), chain=chain,
                        target_add=self._target_add, target_release=self._target_release,
                        clean_verify=not self._target_add,
                        clean_draft=not self._draft_add and self._drafted_last_step)
        self._target_add, self._target_release = [], []
        if chain is None and self.draft_up and (any(lengths) or self._draft_add or self._draft_release):
            plan.drafting = [i for i, k in enumerate(lengths) if k > 0]
            if not plan.clean_draft:  # what the draft runs before its proposal, for the policy's join cost
                plan.joined = (sum(len(a.prompt_ids) for a in self._draft_add)
                               + sum(self._join_tokens(batch[i]) for i in plan.drafting))
            plan.propose = ProposeRequest(
                items=[ProposeItem(batch[i].seq_id, lengths[i], tuple(batch[i].unsent_to_draft), batch[i].sampling)
                       for i in plan.drafting],
                add=self._draft_add, release=self._draft_release)
            self._draft_add, self._draft_release = [], []  # they go with the proposal
        return plan

    def _plan_chain(self, batch: list[SequenceRun], k: int, tail: int = 0,
                    in_flight: int = 0) -> ProposeRequest | None:
        """The next step's proposal, chained behind this step's verification of k drafts a
        sequence (SpeculativeStep._chain_next): the policy chooses the next step's draft length
        now, one step's evidence earlier than it otherwise would (where it chooses regular
        decoding or lengths that differ, the next step takes that choice: `_decided`). Arrivals
        that fit break the chain (they join at the next step's start, which a chained step
        skips). in_flight: tokens a step still uncommitted may add before this one (this one was
        sent ahead of its commit, coordinator/speculative_ahead.py); such a call carries no
        releases, which a refused call would lose."""
        sampled = not all(s.sampling.params.greedy for s in batch)
        if not self.draft_up or self._fits_waiting() or not self.draft.chains(len(batch), 1, k, sampled, tail):
            return None
        seq_ids = [s.seq_id for s in batch]
        wanted = self.policy.lengths(seq_ids)
        nxt = wanted[0] if wanted else 0
        # The cache must hold the step after next whatever this one accepts.
        room = all(len(s.request.prompt_ids) + len(s.output) + in_flight + k + 1 + nxt <= self.max_seq_len
                   for s in batch)
        if (not nxt or any(w != nxt for w in wanted) or not room
                or not self.draft.chains(len(batch), nxt, k, sampled, tail)):
            self._decided = dict(zip(seq_ids, wanted))
            return None
        release = []
        if not in_flight:
            release, self._draft_release = self._draft_release, []
        return ProposeRequest(items=[ProposeItem(s.seq_id, nxt, (), s.sampling) for s in batch], release=release)

    def _commit_speculative(self, plan: StepPlan, outcome: StepOutcome) -> list[RequestRun]:
        batch = plan.batch
        self.step_stats.draft_compute_s += outcome.draft_compute_s
        self._drafted_last_step = outcome.draft_forwards > 0
        size, k = len(batch), max(outcome.lengths, default=0)
        finished = self._commit(batch, outcome.drafts, outcome.verified, outcome.draft_forwards, outcome.draft_s,
                                outcome.verify_s, timed=outcome.verify_s if plan.clean_verify else None,
                                draft_wait_s=outcome.draft_wait_s)
        if outcome.next_chain is not None and outcome.next_chain.queued:  # a remote pair's worker may decline
            for seq in batch:  # the draft has them from the verdicts (reconcile)
                seq.unsent_to_draft.clear()
            self._chain = outcome.next_chain
        # The policy is given the whole step: draft, verification and what the loop does
        # around them (the commit, the next step's set-up), since regular decoding pays the
        # latter once per token and speculation once per step (at batch 1 on an H100, a
        # regular step's Verify read 1.84 ms of a 2.10 ms step). The rest counts as verification.
        # Only where the step before drafted the same length: a return from regular decoding
        # never has a chained proposal, and a one-step probe of another length often has none,
        # so nothing hides their draft and round trip. Timed as steady costs they priced the
        # lengths auto only probes at 2-3x (H100, T = 0.8, 8 sequences: k = 1 6.5 ms and k = 3
        # 7.3 ms against k = 4's 2.9), and it kept drafting k = 4-5 where k = 3 ran faster.
        period = self._period()
        steady = plan.clean_verify and period is not None and k == self._last_length
        self._last_length = k
        self.policy.observe_costs(size, outcome.draft_forwards if plan.clean_draft else 0, outcome.draft_s, k,
                                  period - outcome.draft_s if steady else None, joined=plan.joined)
        self.step_stats.add_step(self.clock() - plan.step_started)
        self.step_stats.chained_steps += plan.chain is not None
        self.step_stats.sent_ahead_steps += plan.sent_ahead
        return finished

    def _streamed_step(self, prefill: PrefillBudget) -> list[RequestRun]:
        """A step of streamed speculation (coordinator/streamed_step.py): verify what the draft,
        running ahead on its own, has drafted. A sequence the draft does not hold yet (the
        prefill budget) verifies stand-ins and is decided by the target alone."""
        finished = self._drain_in_flight() if self.regular.in_flight else []
        batch = self.running
        if not batch:
            return finished
        self._attach_where_wanted(batch, {s.seq_id: 1 for s in batch}, prefill)
        rooms = [self.max_seq_len - len(s.request.prompt_ids) - len(s.output) - 1 for s in batch]
        plan = StreamPlan(batch=batch, rooms=rooms, step_started=self.clock(), target_add=self._target_add,
                          target_release=self._target_release, draft_add=self._draft_add,
                          draft_release=self._draft_release)
        self._target_add, self._target_release, self._draft_add, self._draft_release = [], [], [], []
        outcome = self.streamed.execute(plan)
        if outcome.draft_error is not None:
            self._draft_failed(outcome.draft_error)
        st = self.step_stats
        st.stream_arrived += outcome.arrived
        st.stream_kept += outcome.kept
        st.stream_starved += outcome.starved
        st.stream_draft_busy_s += outcome.draft_busy_s
        st.stream_looked_up += outcome.looked_up
        st.stream_lookup_kept += outcome.lookup_kept
        finished += self._commit(batch, outcome.drafts, outcome.verified, 0, outcome.draft_wait_s,
                                 outcome.verify_s, draft_wait_s=outcome.draft_wait_s, policy_observes=False)
        for seq in batch:  # the executor sent the draft the verdicts themselves
            seq.unsent_to_draft.clear()
        self.step_stats.add_step(self.clock() - plan.step_started)
        return finished

    def _leave_stream(self, batch: list[SequenceRun]) -> None:
        """Regular decoding for a while (a batch too large for streamed steps to pay, or the
        draft down): the draft stops following these sequences, which would otherwise drift
        from what the target commits meanwhile; they rejoin it (a prefill) when streamed steps
        resume."""
        for seq in batch:
            if seq.drafted:
                seq.drafted = False
                seq.unsent_to_draft.clear()
                self.streamed.forget([seq.seq_id])
                if self.draft_up:
                    self._draft_release.append(seq.seq_id)

    def _fits_waiting(self) -> bool:
        """Whether the first waiting request would be admitted now, slots and batch allowing."""
        if not self.waiting:
            return False
        n = len(self.waiting[0].sequences)
        return (len(self.running) + n <= self.config.max_batch_size
                and self._slots_held + n <= self.slot_capacity)

    def _regular_step(self) -> list[RequestRun]:
        """Regular decoding over a target that overlaps calls (coordinator/regular_pipeline.py):
        send this step's Verify, then commit the oldest answer while the worker runs the steps
        in flight."""
        step_started = self.clock()
        batch = [s for s in self.running if len(s.output) + s.steps_in_flight < s.request.criteria.max_new_tokens]
        if batch:
            full = self.regular.send(batch, self._target_add, self._target_release, step_started)
            self._target_add, self._target_release = [], []
            if not full:  # filling the pipeline: counted with the first commit
                self._uncounted_step_s += self.clock() - step_started
                return []
        if not self.regular.in_flight:
            return []
        return self._commit_regular(step_started, self.regular.answer_oldest(overlapped=bool(batch)))

    def _drain_in_flight(self) -> list[RequestRun]:
        """Commit every regular step in flight, oldest first (before a speculative step, or
        when no sequence is left to run)."""
        finished = []
        while self.regular.in_flight:
            finished += self._commit_regular(self.clock(), self.regular.answer_oldest(overlapped=False))
        # The speculative step that follows waits for these answers, but it is not a steady step
        # of its length (the step before it drafted none), so its time never reaches the policy
        # (_commit_speculative; charged to it, such a step read 9-12 ms against ~3 steady on an
        # H100, steering `auto` away from the length it resumed at).
        return finished

    def _commit_regular(self, step_started: float, answered: Answered) -> list[RequestRun]:
        """Commit a regular step's answer; only a steady step's time is given to the policy
        (RegularPipeline's Answered.steady)."""
        self._drafted_last_step, self._last_length = False, 0
        counted = any(seq.finish_reason is None for seq in answered.batch)  # else not a step (see _commit)
        finished = self._commit(answered.batch, [()] * len(answered.batch), answered.verified, 0, 0.0,
                                answered.verify_s, timed=answered.verify_s if answered.steady else None)
        period = self._period() if answered.steady else None  # the whole step, as for speculative steps
        self.policy.observe_costs(len(answered.batch), 0, 0.0, 0, self._regular_prices.add(period))
        if counted:
            self.step_stats.add_step(self.clock() - step_started + self._uncounted_step_s)
            self._uncounted_step_s = 0.0
        return finished

    def _commit(self, batch: list[SequenceRun], drafts: list[tuple[int, ...]], verified: VerifyResponse,
                draft_forwards: int, draft_s: float, verify_s: float, timed: float | None = None,
                draft_wait_s: float = 0.0, policy_observes: bool = True) -> list[RequestRun]:
        """Commit a step's verdicts; returns the requests it finished. Sequences that finished
        while the step ran (cancelled, out of time, or done in the step before a pipelined
        one) are skipped. draft_s: the policy's draft cost (traced); draft_wait_s: how long the
        host waited for the drafts (what the step statistics count)."""
        live = [(seq, draft, verdict) for seq, draft, verdict in zip(batch, drafts, verified.verdicts)
                if seq.finish_reason is None]
        if not live:  # a pipelined step whose every sequence finished in the step before
            return []
        batch = [seq for seq, _, _ in live]
        drafts = [draft for _, draft, _ in live]
        verdicts = [verdict for _, _, verdict in live]
        if policy_observes:  # a streamed step's blocks (stand-ins, drafts the policy never chose) are no evidence
            # Accepted counts may run past the drafts: lookup tokens the target verified after
            # them (its lookup_tail), which the policies count in a step's yield only.
            self.policy.observe([s.seq_id for s in batch], [len(d) for d in drafts], [v.accepted for v in verdicts])
            self.step_stats.lookup_tail_kept += sum(max(0, v.accepted - len(d)) for v, d in zip(verdicts, drafts))
        touched: dict[int, RequestRun] = {}
        for seq, draft, verdict in zip(batch, drafts, verdicts):
            req = seq.request
            touched[id(req)] = req
            req.stats.sequence_steps += 1
            req.stats.draft_tokens += len(draft)
            # Of the drafts proposed (a streamed step's stand-ins count none, though the target
            # may take some of them: those are the target's own tokens, not accepted drafts).
            req.stats.accepted_tokens += min(verdict.accepted, len(draft))
            req.stats.rejections += verdict.accepted < len(draft)
            self._extend(seq, verdict.tokens)
        for req in touched.values():
            req.stats.steps += 1
        st = self.step_stats
        st.steps += 1
        k = max(map(len, drafts))
        st.steps_by_length[k] = st.steps_by_length.get(k, 0) + 1
        st.sequence_steps += len(batch)
        committed = sum(len(v.tokens) for v in verdicts)
        st.committed_tokens += committed
        st.draft_tokens += sum(len(d) for d in drafts)
        st.accepted_tokens += sum(min(v.accepted, len(d)) for v, d in zip(verdicts, drafts))
        st.draft_forwards += draft_forwards
        st.verify_tokens += sum(len(d) for d in drafts) + len(batch)
        st.draft_s += draft_wait_s
        st.verify_s += verify_s
        st.verify_compute_s += verified.compute_s
        st.verify_device_wait_s += verified.device_wait_s
        if st.trace is not None:
            per_sequence = [(seq.seq_id, len(verdict.tokens)) for seq, verdict in zip(batch, verdicts)]
            st.trace.append((k, len(batch), committed, draft_s, timed, per_sequence, self.clock()))
        self.running = [s for s in self.running if s.finish_reason is None]
        finished = []
        for req in touched.values():
            if req.done:
                self._finish(req)
                finished.append(req)
        return finished

    def flush_releases(self) -> None:
        """Release finished sequences now rather than with the next step."""
        if self._target_release:
            self.target.release(self._target_release)
        if self.draft_up and self._draft_release:
            try:
                if self.streamed is not None:  # the stream's loop holds the draft's sequences
                    self.streamed.stream.send(StreamControl(release=self._draft_release))
                else:
                    self.draft.release(self._draft_release)
            except Exception as exc:  # noqa: BLE001
                self._draft_failed(exc)
        self._target_release, self._draft_release = [], []

    # -- draft availability -------------------------------------------------------------------------
    def _connect_draft(self) -> None:
        try:
            info = self.draft.info()
            if info.vocab_size != self.target_info.vocab_size:
                raise ValueError(f"draft vocabulary ({info.vocab_size}) differs from the target's "
                                 f"({self.target_info.vocab_size}); the models must share a tokenizer")
            if self.streamed is not None:
                self.streamed.close()  # before the reset: its loop drafts for the draft's sequences
            self.draft.reset()
            if self.streamed is not None:
                self.streamed.open(self.draft.open_stream(StreamControl(
                    lookahead=self.config.draft_stream.lookahead, chunk=self.config.draft_stream.chunk)))
        except WorkerUnavailableError as exc:
            log.warning("draft unavailable (%s); regular decoding until it answers", exc)
            self._next_probe = self.clock() + self.reconnect_interval_s
            return
        self.slot_capacity = min(self.target_info.num_slots, info.num_slots)
        self.max_seq_len = min(self.target_info.max_seq_len, info.max_seq_len)
        self.draft_up = True
        # Whether draft and target share a device is known once both answered Info: a remote
        # pair that restarted together is one again only once the draft has reconnected.
        # A draft on a GPU or in a process of its own hands its tokens over through the host
        # (in-process workers report no instance_id; a service reports its process's).
        shares = (bool(getattr(self.target, "verifies_device_drafts", False))
                  and same_device(info.device, self.target_info.device)
                  and info.instance_id == self.target_info.instance_id)
        self.speculative.fed_verify = self.speculative.chains = shares
        log.info("draft ready: %s on %s%s", info.model_name, info.device,
                 " (shares the target's device: a speculative step is one call)" if shares else "")

    def _draft_failed(self, exc: Exception) -> None:
        log.warning("draft failed (%s); continuing with regular decoding", exc)
        self.draft_up = False
        self._next_probe = self.clock() + self.reconnect_interval_s
        self._chain = None
        self._draft_add, self._draft_release = [], []
        if self.streamed is not None:
            self.streamed.close()
        for seq in self.running:
            seq.drafted = False
            seq.unsent_to_draft.clear()

    def check_draft(self) -> None:
        """While idle: probe the draft every reconnect_interval_s, so that its availability (and
        the gauge showing it) stays current without traffic: a draft that died is noticed, a
        restarted one re-attached. Never raises: the draft is optional."""
        if not self.wants_draft or self.clock() < self._next_probe:
            return
        if not self.draft_up:
            self._maybe_reconnect_draft()
            return
        try:
            self.draft.info()
        except Exception as exc:  # noqa: BLE001 - speculation is optional; never fail for it
            self._draft_failed(exc)
        else:
            self._next_probe = self.clock() + self.reconnect_interval_s

    def _maybe_reconnect_draft(self) -> None:
        if self.draft_up or not self.wants_draft or self.clock() < self._next_probe:
            return
        self._connect_draft()
        if self.draft_up:  # running sequences rejoin it as speculation asks for them (_attach_to_draft)
            log.info("draft is back; %d running sequences rejoin it as they draft", len(self.running))

    # -- internals --------------------------------------------------------------------------------
    def _expire_budgets(self) -> list[RequestRun]:
        now = self.clock()
        expired = []
        for run in list(self.waiting):
            if run.deadline is not None and now >= run.deadline:
                self.waiting.remove(run)
                expired.append(run)
        for req in {id(s.request): s.request for s in self.running}.values():
            if req.deadline is not None and now >= req.deadline:
                for seq in req.sequences:
                    if seq.finish_reason is None:
                        self._finish_sequence(seq, FinishReason.TIME_BUDGET)
                expired.append(req)
        if expired:
            self.running = [s for s in self.running if s.finish_reason is None]
        for req in expired:
            for seq in req.sequences:
                if seq.finish_reason is None:  # never admitted
                    seq.finish_reason = FinishReason.TIME_BUDGET
            self._finish(req)
        return expired

    def _admit(self, prefill: PrefillBudget) -> None:
        """Admit waiting requests in arrival order while slots, the batch limit and the step's
        prefill budget allow. The first request that does not fit stops admission (FIFO: a
        long prompt is not overtaken by shorter ones behind it)."""
        self._maybe_reconnect_draft()
        while self.waiting:
            run = self.waiting[0]
            n = len(run.sequences)
            if (len(self.running) + n > self.config.max_batch_size
                    or self._slots_held + n > self.slot_capacity):
                break
            # Only the root is prefilled; its other sequences fork its cache (a copy, no forward).
            if not prefill.take(len(run.prompt_ids)):
                break
            self.waiting.popleft()
            run.started = self.clock()
            run.stats.queue_time_s = run.started - run.submitted
            root = run.sequences[0]
            adds = [AddSequence(root.seq_id, tuple(run.prompt_ids))]
            adds += [AddSequence(s.seq_id, parent_id=root.seq_id) for s in run.sequences[1:]]
            self._target_add.extend(adds)
            self.running.extend(run.sequences)
            self._slots_held += n

    def _wanted_lengths(self, batch: list[SequenceRun]) -> dict[int, int]:
        """The policy's draft length per sequence (by seq_id); none while the draft is down.
        Where the last step already asked the policy (_plan_chain), its answer stands; a
        sequence admitted since takes the length the others were given."""
        decided, self._decided = self._decided, None
        if not self.draft_up:
            return {s.seq_id: 0 for s in batch}
        if decided is not None and any(s.seq_id in decided for s in batch):  # else a batch that has left
            values = set(decided.values())
            default = values.pop() if len(values) == 1 else 0
            return {s.seq_id: decided.get(s.seq_id, default) for s in batch}
        seq_ids = [s.seq_id for s in batch]
        return dict(zip(seq_ids, self.policy.lengths(seq_ids, join=lambda: self._join(batch))))

    def _join(self, batch: list[SequenceRun]) -> Join:
        """What speculating would first cost the draft for this batch (see Join)."""
        remaining = [s.request.request.max_new_tokens - len(s.output) for s in batch]
        return Join(tokens=sum(self._join_tokens(s) for s in batch if s.request.request.speculate),
                    horizon=statistics.median_low(remaining))

    def _join_tokens(self, seq: SequenceRun) -> int:
        """Tokens the draft must run for `seq` before it drafts: after regular steps, those it
        skipped beyond a step's usual; where it does not hold the sequence, its prompt and
        output (none for a fresh sequence that forks its fresh root's cache, as
        _attach_to_draft does)."""
        if seq.drafted:
            return 0 if self._drafted_last_step else max(0, len(seq.unsent_to_draft) - _STEADY_PENDING)
        root = seq.request.sequences[0]
        if seq is not root and not seq.output and not root.output:
            return 0
        return len(seq.request.prompt_ids) + len(seq.output)

    def _attach_where_wanted(self, batch: list[SequenceRun], wanted: dict[int, int], prefill: PrefillBudget) -> None:
        """Attach sequences to the draft where speculation first wants them."""
        if not self.draft_up:
            return
        if not any(s.drafted for s in batch):
            # Nothing is speculating yet (a first wave, speculation turned back on, a draft
            # restart): everyone joins at once. Joining a few per step would leave the rest
            # decoding without drafts, and steps with mixed lengths run without CUDA graphs:
            # on the H100 at batch 64 that cost 48 steps instead of 37 for 128 tokens.
            prefill = PrefillBudget(sys.maxsize)
        self._attach_to_draft([s for s in batch if wanted[s.seq_id] > 0 and not s.drafted
                               and s.request.request.speculate], prefill)

    def _capped_lengths(self, batch: list[SequenceRun], wanted: dict[int, int]) -> list[int]:
        out = []
        for seq in batch:
            # Drafts may run past max_new_tokens (the stop check cuts the committed tokens
            # there), which keeps every sequence at the same k, so the step stays one CUDA
            # graph; they must not run past the KV cache: the pending token plus k drafts.
            room = self.max_seq_len - len(seq.request.prompt_ids) - len(seq.output)
            out.append(min(wanted[seq.seq_id], room) if seq.drafted else 0)
        return out

    def _attach_to_draft(self, seqs: list[SequenceRun], prefill: PrefillBudget) -> None:
        """Give sequences to the draft worker the first time speculation wants them, not at
        admission: where the policy picks regular decoding (large batches, slow drafts) the
        draft would prefill every new sequence in vain. Fresh sequences of one request share
        their root's prefill, as on the target; others bring their prompt and output so far
        (after a draft restart, or when speculation resumes).

        Their prefill shares the step's budget with the target's admissions, which go first
        (a new request's first token before a running one's speed-up); a sequence left out
        decodes without drafts (its tokens are the target's either way) and joins in a later
        step, in batch order."""
        for seq in seqs:  # batch order: a request's root comes before its other sequences
            root = seq.request.sequences[0]
            # A fork copies its root's record on the draft, which a draft stream extends with
            # drafts of its own at once: there, each sequence brings its prompt.
            if (seq is not root and not seq.output and root.drafted and not root.output
                    and self.streamed is None):
                add = AddSequence(seq.seq_id, parent_id=root.seq_id)
            else:
                add = AddSequence(seq.seq_id, tuple(seq.request.prompt_ids + seq.output))
            if not prefill.take(len(add.prompt_ids)):
                break
            self._draft_add.append(add)
            seq.drafted = True
            seq.unsent_to_draft.clear()

    def _extend(self, seq: SequenceRun, tokens: list[int]) -> None:
        decision = check_stop(len(seq.output), seq.text, tokens, seq.request.criteria)
        kept = tokens[:decision.keep]
        seq.output.extend(kept)
        seq.text.extend(decision.text_tokens(tokens))
        seq.unsent_to_draft.extend(tokens)
        seq.request.stats.generated_tokens += decision.keep
        if decision.reason is not None:
            seq.text_end = decision.text_end
            self._finish_sequence(seq, decision.reason)
        seq.request.deltas.append((seq.index, kept, seq.finish_reason))

    def _finish_sequence(self, seq: SequenceRun, reason: FinishReason) -> None:
        req = seq.request
        seq.finish_reason = reason
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            seq.finish_order = 1 + sum(1 for s in req.sequences if s.finish_order)
            seq.finish_ms = 1000 * (self.clock() - req.submitted)
        self.policy.forget(seq.seq_id)
        if self.streamed is not None:
            self.streamed.forget([seq.seq_id])
        self._target_release.append(seq.seq_id)
        if seq.drafted:
            self._draft_release.append(seq.seq_id)
        self._slots_held -= 1

    def _finish(self, req: RequestRun) -> None:
        req.stats.wall_time_s = self.clock() - (req.started if req.started is not None else req.submitted)
        req.result = GenerationResult(sequences=[self.sequence_output(s) for s in req.sequences], stats=req.stats)
        log.debug("request finished: %d sequences, %s", len(req.sequences), req.stats.to_dict())

    def sequence_output(self, s: SequenceRun) -> SequenceOutput:
        text = s.text.text()
        if s.text_end is not None:
            text = text[:s.text_end]
        return SequenceOutput(index=s.index, text=text, token_ids=list(s.output), finish_reason=s.finish_reason,
                              finish_order=s.finish_order, finish_ms=s.finish_ms)
