"""The coordinator's step loop: exact stops, continuous batching, capacity, slot release."""

import json
import shutil

import time

import pytest

from bass.coordinator.requests import FinishReason, GenerationRequest
from bass.core.errors import InvalidRequestError
from conftest import build_scheduler

PROMPT = (5, 17, 33, 200)


@pytest.fixture(scope="module")
def reference(llama_target):
    """Target-only greedy output and its text, one token per step."""
    s = build_scheduler(llama_target, None)
    (r,) = s.generate([GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30, ignore_eos=True)])
    return r.sequences[0].token_ids, s.codec


def run_both(target, request):
    """The same request with one token per step and with up to 7 per step (draft = target)."""
    regular = build_scheduler(target, None).generate([request])[0]
    fast = build_scheduler(target, target, "6").generate([request])[0]
    assert fast.stats.steps < regular.stats.steps  # several tokens really committed per step
    return regular, fast


def test_stop_string_cuts_exactly_mid_step(llama_target, reference):
    ids, codec = reference
    text = codec.decode(ids)
    start = len(codec.decode(ids[:9]))
    stop = text[start:start + 3]
    assert len(stop) == 3
    cut = text.find(stop)
    request = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30, stop=("\x00never", stop), ignore_eos=True)
    for result in run_both(llama_target, request):
        seq = result.sequences[0]
        assert seq.finish_reason == FinishReason.STOP
        assert seq.text == text[:cut]
        # the kept tokens are exactly those up to the one that completed the stop string
        n = next(j for j in range(1, len(ids) + 1) if stop in codec.decode(ids[:j]))
        assert seq.token_ids == ids[:n]


def test_stop_token_id_is_kept_and_nothing_after(llama_target, reference):
    ids, _ = reference
    stop_id = ids[7]
    first = ids.index(stop_id)
    request = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30, stop_token_ids=(stop_id,), ignore_eos=True)
    for result in run_both(llama_target, request):
        assert result.sequences[0].token_ids == ids[:first + 1]
        assert result.sequences[0].finish_reason == FinishReason.STOP


def test_eos_from_generation_config_stops(llama_target, reference, tmp_path):
    ids, _ = reference
    model = tmp_path / "eos-model"
    shutil.copytree(llama_target, model)
    eos = ids[5]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    first = ids.index(eos)
    request = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30)
    for result in run_both(model, request):
        assert result.sequences[0].token_ids == ids[:first + 1]
        assert result.sequences[0].finish_reason == FinishReason.STOP
    ignoring = build_scheduler(model, model, "6").generate(
        [GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30, ignore_eos=True)])[0]
    assert ignoring.sequences[0].token_ids == ids


@pytest.mark.parametrize("max_new", [1, 2, 9, 13])
def test_max_new_tokens_is_exact(llama_target, reference, max_new):
    ids, _ = reference
    request = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=max_new, ignore_eos=True)
    fast = build_scheduler(llama_target, llama_target, "6").generate([request])[0]
    assert fast.sequences[0].token_ids == ids[:max_new]
    assert fast.sequences[0].finish_reason == FinishReason.LENGTH


def test_requests_joining_mid_flight_get_the_same_output(llama_target, llama_draft):
    prompts = [PROMPT, (42, 43), tuple(range(3, 15))]
    reqs = [GenerationRequest(prompt_ids=p, max_new_tokens=16 + i, n=2, ignore_eos=True) for i, p in enumerate(prompts)]
    alone = [build_scheduler(llama_target, None).generate([r])[0] for r in reqs]
    s = build_scheduler(llama_target, llama_draft, "bass")
    runs = [s.submit(reqs[0])]
    s.step()
    s.step()
    runs.append(s.submit(reqs[1]))
    s.step()
    runs.append(s.submit(reqs[2]))
    while s.has_work:
        s.step()
    for run, want in zip(runs, alone):
        assert [q.token_ids for q in run.result.sequences] == [q.token_ids for q in want.sequences]


def test_requests_wait_for_free_slots_and_every_slot_is_released(llama_target, llama_draft):
    s = build_scheduler(llama_target, llama_draft, "bass", num_slots=4, max_n=4)
    reqs = [GenerationRequest(prompt_ids=PROMPT + (i,), n=3, max_new_tokens=6 + i, ignore_eos=True) for i in range(5)]
    runs = [s.submit(r) for r in reqs]
    s.step()
    assert len(s.running) == 3 and len(s.waiting) == 4  # one request of 3 fits in 4 slots
    while s.has_work:
        s.step()
    s.flush_releases()
    assert all(len(r.result.sequences) == 3 for r in runs)
    assert [len(r.result.sequences[0].token_ids) for r in runs] == [6, 7, 8, 9, 10]
    for worker in (s.target, s.draft):
        assert worker.runner.sequences == {} and worker.runner.cache.free_slots == 4


def test_limits_are_enforced_at_submit(llama_target):
    s = build_scheduler(llama_target, None, num_slots=4, max_n=8, max_seq_len=64)
    with pytest.raises(InvalidRequestError, match="n: 9 exceeds"):
        s.submit(GenerationRequest(prompt_ids=PROMPT, n=9))
    with pytest.raises(InvalidRequestError, match="n: 5 sequences can never fit"):
        s.submit(GenerationRequest(prompt_ids=PROMPT, n=5))
    with pytest.raises(InvalidRequestError, match="max_new_tokens.*max_seq_len"):
        s.submit(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=61))
    with pytest.raises(InvalidRequestError, match="prompt_ids: token ids must be < vocabulary"):
        s.submit(GenerationRequest(prompt_ids=(1, 99999)))
    with pytest.raises(InvalidRequestError, match="prompt: give exactly one"):
        GenerationRequest()
    with pytest.raises(InvalidRequestError, match="stop"):
        GenerationRequest(prompt="x", stop=("",))
    assert not s.has_work


def test_zero_draft_length_never_calls_the_draft(llama_target, llama_draft):
    s = build_scheduler(llama_target, llama_draft, "0")
    calls = []
    original = s.draft.propose
    s.draft.propose = lambda req: calls.append(req) or original(req)
    s.generate([GenerationRequest(prompt_ids=PROMPT, max_new_tokens=5)])
    assert calls == []


def test_text_prompt_uses_the_tokenizer(llama_target, llama_draft):
    s = build_scheduler(llama_target, llama_draft, "3")
    (r,) = s.generate([GenerationRequest(prompt="def fibonacci(n):", max_new_tokens=8, ignore_eos=True)])
    ids = s.codec.encode("def fibonacci(n):")
    (same,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=tuple(ids), max_new_tokens=8, ignore_eos=True)])
    assert r.sequences[0].token_ids == same.sequences[0].token_ids
    assert r.sequences[0].text == s.codec.decode(same.sequences[0].token_ids)


class ScriptedPolicy:
    """Draft lengths in a fixed order, one per step (the last one repeats)."""

    def __init__(self, ks):
        self.ks = list(ks)

    def lengths(self, seq_ids, join=None):
        return [self.ks.pop(0) if len(self.ks) > 1 else self.ks[0]] * len(seq_ids)

    def observe(self, *args):
        pass

    def observe_costs(self, *args, **kwargs):
        pass

    def forget(self, seq_id):
        pass


class CostRecordingPolicy(ScriptedPolicy):
    def __init__(self, ks):
        super().__init__(ks)
        self.costs = []  # (k, verification seconds as given) per timed step

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        if verify_s is not None:
            self.costs.append((verify_k, verify_s))


def test_the_policy_is_given_whole_steps_with_the_loops_own_work(llama_target, llama_draft, monkeypatch):
    """A step costs its draft call, its Verify, and the loop's work around them (the commit,
    the next step's set-up); regular decoding pays that work once per token, speculation once
    per step, so the policy must see it in both, or it favours regular decoding. Here the
    commit is made to take 30 ms, far more than a Verify of the tiny model: every timed step,
    regular (pipelined) and speculative, must include it."""
    s = build_scheduler(llama_target, llama_draft, "4")
    s.policy = CostRecordingPolicy([0] * 8 + [3] * 6 + [0])
    commit = s._commit
    slow_commit_s = 0.03

    def slow_commit(*args, **kwargs):
        time.sleep(slow_commit_s)
        return commit(*args, **kwargs)

    monkeypatch.setattr(s, "_commit", slow_commit)
    s.generate([GenerationRequest(prompt_ids=PROMPT, n=2, max_new_tokens=40, ignore_eos=True)])
    regular = [cost for k, cost in s.policy.costs if k == 0]
    speculative = [cost for k, cost in s.policy.costs if k > 0]
    assert len(regular) >= 3 and len(speculative) >= 3, s.policy.costs
    assert min(regular + speculative) >= slow_commit_s, s.policy.costs


class RecordingDraft:
    """The in-process draft worker, recording each Propose request."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, request):
        self.calls.append(request)
        return self.inner.propose(request)

    def start_propose(self, request):  # in-process, the scheduler starts proposals this way
        self.calls.append(request)
        return self.inner.start_propose(request)


@pytest.mark.parametrize("script", [[0, 0, 0, 3], [3]])
def test_sequences_join_the_draft_only_when_speculation_wants_them(llama_target, script):
    """While the policy picks regular decoding the draft sees nothing (no prefill in vain);
    the step that first drafts brings each sequence's prompt and output so far, or, for a
    fresh request, the root's prompt and forks of it. The draft (here = the target) then holds
    exactly the right cache: every proposal is accepted, and the text is the target's."""
    s = build_scheduler(llama_target, llama_target, "4")
    s.draft, s.policy = RecordingDraft(s.draft), ScriptedPolicy(script)
    request = GenerationRequest(prompt_ids=PROMPT, n=2, max_new_tokens=20, ignore_eos=True)
    (result,) = s.generate([request])
    (regular,) = build_scheduler(llama_target, None).generate([request])
    assert [x.token_ids for x in result.sequences] == [x.token_ids for x in regular.sequences]
    assert result.stats.draft_tokens > 0 and result.stats.accepted_tokens == result.stats.draft_tokens
    first = s.draft.calls[0]
    regular_steps = script.count(0)
    roots, forks = [a for a in first.add if a.parent_id is None], [a for a in first.add if a.parent_id is not None]
    if regular_steps:
        assert not forks and [a.prompt_ids for a in roots] == [PROMPT + tuple(x.token_ids[:regular_steps])
                                                               for x in result.sequences]
    else:
        assert [a.prompt_ids for a in roots] == [PROMPT] and len(forks) == 1
    assert [i.num_tokens for i in first.items] == [3, 3]


class JoinRecordingPolicy(ScriptedPolicy):
    """Scripted lengths; records the join estimate it is given and the tokens each step joined."""

    def __init__(self, ks):
        super().__init__(ks)
        self.estimates, self.joined = [], []  # per lengths() call; per step: (k, joined)

    def lengths(self, seq_ids, join=None):
        self.estimates.append(join())
        return super().lengths(seq_ids)

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        self.joined.append((verify_k, joined))


def test_the_policy_is_told_what_joining_the_draft_costs(llama_target):
    """Before each step the policy can ask what speculating would first cost the draft (its
    prompt and output for a sequence it does not hold, none for a fork of a fresh root; after
    regular steps, the tokens skipped beyond a step's usual two for one it holds; nothing while
    speculating) and how many tokens the batch may still decode; after a step it is told what
    the draft ran before its proposal."""
    s = build_scheduler(llama_target, llama_target, "4")
    s.draft, s.policy = RecordingDraft(s.draft), JoinRecordingPolicy([0, 0, 0, 3, 3, 0, 0, 0, 0, 3, 3])
    request = GenerationRequest(prompt_ids=PROMPT, n=2, max_new_tokens=24, ignore_eos=True)
    s.generate([request])
    pol, calls = s.policy, s.draft.calls
    fresh = pol.estimates[0]
    assert fresh.tokens == len(PROMPT) and fresh.horizon == 24  # the second sequence forks the first
    drafted = [i for i, (k, _) in enumerate(pol.joined) if k]
    first, steady, back = drafted[0], drafted[1], drafted[2]
    assert (first, steady) == (3, 4) and back > steady + 1
    # the first drafted step joined both sequences, each with its prompt and output so far
    assert pol.joined[first][1] == sum(len(a.prompt_ids) for a in calls[0].add) > 2 * len(PROMPT)
    # estimated before the regular step in flight was committed: one token each short at most
    assert pol.joined[first][1] - 2 <= pol.estimates[first].tokens <= pol.joined[first][1]
    assert 24 - 4 <= pol.estimates[first].horizon < 24
    assert pol.joined[steady][1] == 0 and pol.estimates[steady].tokens == 0  # after a drafted step: nothing
    returning = next(c for c in calls[1:] if c.items and len(c.items[0].committed) > 4)
    assert pol.joined[back][1] == sum(len(it.committed) - 2 for it in returning.items) > 0


# -- the prefill budget ------------------------------------------------------------------------------
class RecordingTarget:
    """The in-process target worker, recording the prompt lengths each Verify call adds
    (a fork counts 0: it copies its parent's cache and runs nothing)."""

    def __init__(self, inner):
        self.inner, self.adds = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, request):
        self.adds.append([len(a.prompt_ids) for a in request.add])
        return self.inner.verify(request)

    def start_verify(self, request, drafts=None):  # regular steps, one in flight; drafts on the device
        self.adds.append([len(a.prompt_ids) for a in request.add])
        return self.inner.start_verify(request, drafts)


def prompts_of(lengths):
    return [tuple(range(3 + 7 * i, 3 + 7 * i + n)) for i, n in enumerate(lengths)]


def test_the_prefill_budget_spreads_a_burst_over_steps(llama_target):
    """Six 8-token prompts at once, while a request runs, under a budget of 20: two per step,
    in arrival order, and every answer is token for token what it is when all six are
    prefilled in one step. With nothing running, the first wave is admitted whole."""
    reqs = [GenerationRequest(prompt_ids=p, max_new_tokens=10, ignore_eos=True) for p in prompts_of([8] * 6)]
    unbounded = build_scheduler(llama_target, None, "0", prefill_budget=20)
    unbounded.target = RecordingTarget(unbounded.target)
    want = unbounded.generate(reqs)
    assert unbounded.target.adds[0] == [8] * 6  # nothing was running: nobody to stall
    s = build_scheduler(llama_target, None, "0", prefill_budget=20)
    s.target = RecordingTarget(s.target)
    s.submit(GenerationRequest(prompt_ids=(1, 2), max_new_tokens=30, ignore_eos=True))
    s.step()  # it runs; from now on an arrival's prefill would stall it
    runs = [s.submit(r) for r in reqs]
    admitted = []
    while s.has_work:
        before = {id(r) for r in runs if r.started is None}
        s.step()
        admitted.append([i for i, r in enumerate(runs) if id(r) in before and r.started is not None])
    assert admitted[:3] == [[0, 1], [2, 3], [4, 5]]
    assert s.target.adds[1:4] == [[8, 8]] * 3
    assert [[q.token_ids for q in r.result.sequences] for r in runs] == [[q.token_ids for q in w.sequences]
                                                                         for w in want]


def test_a_prompt_over_the_budget_goes_alone_and_is_not_overtaken(llama_target):
    """Budget 10, a request running: the 30-token prompt is admitted (alone, in the next step),
    and the short prompts behind it wait for it although the first step had room for two."""
    reqs = [GenerationRequest(prompt_ids=p, n=2 if i == 1 else 1, max_new_tokens=12, ignore_eos=True)
            for i, p in enumerate(prompts_of([4, 30, 4, 4, 4]))]
    s = build_scheduler(llama_target, None, "0", prefill_budget=10)
    s.target = RecordingTarget(s.target)
    s.submit(GenerationRequest(prompt_ids=(1, 2), max_new_tokens=30, ignore_eos=True))
    s.step()
    runs = [s.submit(r) for r in reqs]
    while s.has_work:
        s.step()
    results = [r.result for r in runs]
    # the long request's second sequence is a fork of its first: no prefill of its own
    assert s.target.adds[1:5] == [[4], [30, 0], [4, 4], [4]]
    alone = [build_scheduler(llama_target, None, "0").generate([r])[0] for r in reqs]
    assert [[q.token_ids for q in r.sequences] for r in results] == [[q.token_ids for q in a.sequences]
                                                                     for a in alone]


def test_the_draft_prefill_shares_the_step_budget(llama_target):
    """While sequences speculate, the draft prefill of newcomers shares the step's budget with
    admission (a single item over it goes alone), so speculation does not double an arrival's
    stall: the step that admits requests leaves their draft prefill to later steps. Sequences
    left out meanwhile decode without drafts; the draft (= the target) still holds exactly the
    right cache once they join: every proposal is accepted, and the text is regular decoding's.
    With nothing speculating yet, everyone joins at once (nobody to stall)."""
    budget = 20
    reqs = [GenerationRequest(prompt_ids=p, n=n, max_new_tokens=16, ignore_eos=True)
            for p, n in zip(prompts_of([12, 6]), (2, 1))]
    s = build_scheduler(llama_target, llama_target, "3", prefill_budget=budget)
    s.target, s.draft = RecordingTarget(s.target), RecordingDraft(s.draft)
    draft_adds = []
    original = s._attach_to_draft

    def attach(seqs, prefill):
        before = len(s._draft_add)
        original(seqs, prefill)
        draft_adds.append([len(a.prompt_ids) for a in s._draft_add[before:]])

    s._attach_to_draft = attach
    first = s.submit(GenerationRequest(prompt_ids=(1, 2, 3), max_new_tokens=40, ignore_eos=True))
    s.step()
    assert draft_adds == [[3]] and first.sequences[0].drafted  # the first wave joins at once
    runs = [s.submit(r) for r in reqs]
    while s.has_work:
        s.step()
    results = [r.result for r in runs]
    steps = list(zip(s.target.adds, draft_adds))[1:]
    assert steps[0] == ([12, 0, 6], [])  # both requests admitted; no draft prefill on top of them
    for target_adds, drafts in steps:
        prefilled = [n for n in target_adds + drafts if n]
        assert sum(prefilled) <= budget or len(prefilled) == 1
    assert sum(len(d) for d in draft_adds[1:]) == 3  # every new sequence joined the draft, once
    regular = [build_scheduler(llama_target, None).generate([r])[0] for r in reqs]
    assert [[q.token_ids for q in r.sequences] for r in results] == [[q.token_ids for q in w.sequences]
                                                                     for w in regular]
    for r in results:
        assert r.stats.draft_tokens > 0 and r.stats.accepted_tokens == r.stats.draft_tokens


def test_a_draft_length_decided_for_a_batch_that_left_does_not_carry_to_the_next(llama_target, llama_draft):
    """The policy's choice for the step after next (made while chaining a proposal) is kept by
    seq_id; a new batch with none of those sequences asks the policy afresh instead of taking
    the old batch's length (regular decoding, say) as its own."""
    from bass.coordinator.draft_length import FixedLength

    s = build_scheduler(llama_target, llama_draft, draft_length="3")
    s.policy = FixedLength(3)
    s.submit(GenerationRequest(prompt_ids=(5, 17, 33), max_new_tokens=8, ignore_eos=True))
    s.step()
    batch = list(s.running)
    s._decided = {10_000: 0}  # what a last step of another batch decided
    assert list(s._wanted_lengths(batch).values()) == [3]
    s._decided = {batch[0].seq_id: 2}
    assert list(s._wanted_lengths(batch).values()) == [2], "a decision for this batch stands"
