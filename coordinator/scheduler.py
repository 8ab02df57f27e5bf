"""The step loop: admit requests, pick draft lengths, Propose, Verify, commit, stop.

One `step()` is one BASS step for every running sequence. New requests join between steps
(continuous batching) while KV slots and the batch limit allow; finished sequences leave and
their slots are released with the next call to each worker.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from bass.config import SchedulerConfig
from bass.coordinator.draft_length import make_policy
from bass.coordinator.requests import (FinishReason, GenerationRequest, GenerationResult, RequestStats,
                                       SequenceOutput)
from bass.coordinator.stopping import StopCriteria, check_stop
from bass.coordinator.tokenizer import Codec
from bass.errors import InvalidRequestError
from bass.worker_api import (AddSequence, DraftWorkerAPI, ProposeItem, ProposeRequest, SequenceSampling,
                             TargetWorkerAPI, VerifyItem, VerifyRequest)

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sequence_seed_key(seed: int, index: int) -> int:
    """The randomness key of sample `index` of a request: depends on nothing else."""
    return splitmix64(seed ^ splitmix64(index))


@dataclass
class SequenceRun:
    seq_id: int
    index: int
    request: "RequestRun"
    sampling: SequenceSampling
    output: list[int] = field(default_factory=list)
    unsent_to_draft: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text_end: int | None = None
    drafted: bool = False  # whether the draft worker holds this sequence


@dataclass
class RequestRun:
    request: GenerationRequest
    prompt_ids: list[int]
    criteria: StopCriteria
    sequences: list[SequenceRun] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    started: float = field(default_factory=time.perf_counter)
    result: GenerationResult | None = None

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


class Scheduler:
    def __init__(self, target: TargetWorkerAPI, draft: DraftWorkerAPI | None, codec: Codec,
                 config: SchedulerConfig = SchedulerConfig()):
        self.target, self.draft, self.codec, self.config = target, draft, codec, config
        self.target_info = target.info()
        capacity = self.target_info.num_slots
        if draft is not None:
            draft_info = draft.info()
            if draft_info.vocab_size != self.target_info.vocab_size:
                raise ValueError(f"draft vocabulary ({draft_info.vocab_size}) differs from the target's "
                                 f"({self.target_info.vocab_size}); the models must share a tokenizer")
            capacity = min(capacity, draft_info.num_slots)
        self.slot_capacity = capacity
        self.max_seq_len = min(self.target_info.max_seq_len, draft.info().max_seq_len if draft else 1 << 62)
        self.policy = make_policy(config.draft_length)
        self.speculating = draft is not None and config.draft_length.speculates
        self.waiting: deque[RequestRun] = deque()
        self.running: list[SequenceRun] = []
        self._next_seq_id = 0
        self._slots_held = 0  # running sequences plus finished ones not yet released
        self._target_add: list[AddSequence] = []
        self._draft_add: list[AddSequence] = []
        self._target_release: list[int] = []
        self._draft_release: list[int] = []

    # -- requests ---------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestRun:
        """Validate and queue a request; it joins the batch at the next step with room."""
        cfg = self.config
        if request.n > cfg.max_n:
            raise InvalidRequestError("n", f"{request.n} exceeds the limit of {cfg.max_n}")
        if request.n > min(self.slot_capacity, cfg.max_batch_size):
            raise InvalidRequestError("n", f"{request.n} sequences can never fit: the batch holds at most "
                                           f"{min(self.slot_capacity, cfg.max_batch_size)}")
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
        run = RequestRun(request=request, prompt_ids=prompt_ids,
                         criteria=StopCriteria(frozenset(stop_ids), request.stop, request.max_new_tokens))
        seed = request.seed if request.seed is not None else secrets.randbits(64)
        for index in range(request.n):
            run.sequences.append(SequenceRun(
                seq_id=self._new_seq_id(), index=index, request=run,
                sampling=SequenceSampling(request.sampling, sequence_seed_key(seed, index))))
        self.waiting.append(run)
        return run

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(self, requests: Iterable[GenerationRequest]) -> list[GenerationResult]:
        """Run requests to completion in-process (all batched together); results in order."""
        runs = [self.submit(r) for r in requests]
        while self.has_work:
            self.step()
        self.flush_releases()
        return [r.result for r in runs]

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestRun]:
        """One speculative step for the whole batch; returns the requests that finished."""
        self._admit()
        if not self.running:
            return []
        batch = self.running
        lengths = self._draft_lengths(batch)
        drafts: list[tuple[int, ...]] = [()] * len(batch)
        q, q_offsets = None, [0] * len(batch)
        if self.draft is not None and (any(lengths) or self._draft_add or self._draft_release):
            drafting = [i for i, k in enumerate(lengths) if k > 0]
            response = self.draft.propose(ProposeRequest(
                items=[ProposeItem(batch[i].seq_id, lengths[i], tuple(batch[i].unsent_to_draft), batch[i].sampling)
                       for i in drafting],
                add=self._draft_add, release=self._draft_release))
            self._draft_add, self._draft_release = [], []
            q = response.q
            for n, i in enumerate(drafting):
                batch[i].unsent_to_draft.clear()
                drafts[i] = tuple(response.tokens[n])
                q_offsets[i] = response.q_row_offsets[n]
        verdicts = self.target.verify(VerifyRequest(
            items=[VerifyItem(s.seq_id, drafts[i], s.sampling, q_offsets[i]) for i, s in enumerate(batch)],
            q=q, add=self._target_add, release=self._target_release)).verdicts
        self._target_add, self._target_release = [], []

        accepted = [v.accepted for v in verdicts]
        self.policy.observe([s.seq_id for s in batch], [len(d) for d in drafts], accepted)
        touched: dict[int, RequestRun] = {}
        for seq, draft, verdict in zip(batch, drafts, verdicts):
            req = seq.request
            touched[id(req)] = req
            req.stats.sequence_steps += 1
            req.stats.draft_tokens += len(draft)
            req.stats.accepted_tokens += verdict.accepted
            req.stats.rejections += verdict.accepted < len(draft)
            self._extend(seq, verdict.tokens)
        for req in touched.values():
            req.stats.steps += 1
        self.running = [s for s in batch if s.finish_reason is None]
        finished = [req for req in touched.values() if req.done]
        for req in finished:
            self._finish(req)
        return finished

    def flush_releases(self) -> None:
        """Release finished sequences now rather than with the next step."""
        if self._target_release:
            self.target.release(self._target_release)
        if self.draft is not None and self._draft_release:
            self.draft.release(self._draft_release)
        self._target_release, self._draft_release = [], []

    # -- internals --------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting:
            run = self.waiting[0]
            n = len(run.sequences)
            if (len(self.running) + n > self.config.max_batch_size
                    or self._slots_held + n > self.slot_capacity):
                break
            self.waiting.popleft()
            run.started = time.perf_counter()
            root = run.sequences[0]
            adds = [AddSequence(root.seq_id, tuple(run.prompt_ids))]
            adds += [AddSequence(s.seq_id, parent_id=root.seq_id) for s in run.sequences[1:]]
            self._target_add.extend(adds)
            if self.speculating and run.request.speculate:
                self._draft_add.extend(adds)
                for s in run.sequences:
                    s.drafted = True
            self.running.extend(run.sequences)
            self._slots_held += n

    def _draft_lengths(self, batch: list[SequenceRun]) -> list[int]:
        if not self.speculating:
            return [0] * len(batch)
        wanted = self.policy.lengths([s.seq_id for s in batch])
        out = []
        for seq, k in zip(batch, wanted):
            # A step commits up to k + 1 tokens; never draft past max_new_tokens.
            room = seq.request.criteria.max_new_tokens - len(seq.output) - 1
            out.append(min(k, room) if seq.drafted else 0)
        return out

    def _extend(self, seq: SequenceRun, tokens: list[int]) -> None:
        decision = check_stop(seq.output, tokens, seq.request.criteria, self.codec.decode)
        seq.output.extend(tokens[:decision.keep])
        seq.unsent_to_draft.extend(tokens)
        seq.request.stats.generated_tokens += decision.keep
        if decision.reason is not None:
            seq.finish_reason, seq.text_end = decision.reason, decision.text_end
            self.policy.forget(seq.seq_id)
            self._target_release.append(seq.seq_id)
            if seq.drafted:
                self._draft_release.append(seq.seq_id)
            self._slots_held -= 1

    def _finish(self, req: RequestRun) -> None:
        req.stats.wall_time_s = time.perf_counter() - req.started
        outputs = []
        for s in req.sequences:
            ids = s.output
            text_ids = ids[:-1] if ids and ids[-1] in req.criteria.stop_token_ids else ids
            text = self.codec.decode(text_ids)
            if s.text_end is not None:
                text = text[:s.text_end]
            outputs.append(SequenceOutput(index=s.index, text=text, token_ids=list(ids), finish_reason=s.finish_reason))
        req.result = GenerationResult(sequences=outputs, stats=req.stats)
        log.debug("request finished: %d sequences, %s", len(outputs), req.stats.to_dict())

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id
