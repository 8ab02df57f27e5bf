"""Regular decoding with Verify calls in flight (coordinator/regular_pipeline.py, issue #13): over a
target that overlaps calls, each step's Verify is sent before the previous answer is read, and
as many steps as the target asks for (`steps_in_flight`: one in-process, two over the
services) stay sent and uncommitted after each commit. The output must be exactly what
step-by-step decoding gives, greedy and seeded sampling, with requests finishing, joining and
leaving at different steps; and every slot must be freed."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bass.app.client import FINISH_REASON_NAMES, BassClient
from bass.coordinator.requests import FinishReason, GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.core.config import SamplingParams
from bass.core.errors import WorkerUnavailableError
from conftest import build_scheduler
from services import start_services


class _Pending:
    def __init__(self, owner, call_id, request):
        self.owner, self.call_id, self.request = owner, call_id, request

    def result(self):
        self.owner.events.append(("result", self.call_id))
        time.sleep(self.owner.result_delay)
        if self.owner.fail_at == self.call_id:
            raise WorkerUnavailableError("the target went away")
        return self.owner.worker.verify(self.request)  # calls run in the order sent, as on the stream

    def discard(self):
        self.owner.events.append(("discard", self.call_id))


class OverlappingTarget:
    """The in-process target behind the interface of a remote one whose calls overlap; it
    records when each call is sent and answered."""

    overlaps_calls = True
    verifies_device_drafts = False  # as a remote target: drafts come in the request

    def __init__(self, worker, fail_at=None, steps_in_flight=1, result_delay=0.0):
        self.worker, self.fail_at, self.steps_in_flight = worker, fail_at, steps_in_flight
        self.result_delay = result_delay  # seconds each answer takes to read
        self.events, self.sent = [], 0

    def start_verify(self, request):
        self.sent += 1
        self.events.append(("send", self.sent))
        return _Pending(self, self.sent, request)

    def __getattr__(self, name):  # info, verify, release, reset, runner
        return getattr(self.worker, name)


DEPTHS = pytest.mark.parametrize("depth", [1, 2], ids=["one-in-flight", "two-in-flight"])


def scheduler_pair(target_dir, fail_at=None, depth=1):
    plain = build_scheduler(target_dir, None)
    overlapping = build_scheduler(target_dir, None)
    wrapped = OverlappingTarget(overlapping.target, fail_at, depth)
    return plain, Scheduler(wrapped, None, overlapping.codec, overlapping.config), wrapped


def requests(sampling=SamplingParams(), stop_on=((), (), (), ())):
    return [GenerationRequest(prompt_ids=p, max_new_tokens=m, n=n, stop_token_ids=s, ignore_eos=True,
                              sampling=sampling, seed=100 + i)
            for i, (p, m, n, s) in enumerate(zip([(5, 17, 33), (42,), tuple(range(3, 22)), (100, 101)],
                                                 [9, 23, 4, 16], [1, 2, 1, 3], stop_on))]


def requests_that_stop_early(target_dir, sampling=SamplingParams()):
    """Requests 1 and 3 stop on a token their first sequence makes mid-way (found by a first run)."""
    probe = build_scheduler(target_dir, None).generate(requests(sampling))
    stop_on = [(), (probe[1].sequences[0].token_ids[6],), (), (probe[3].sequences[0].token_ids[4],)]
    return requests(sampling, stop_on)


def run_staggered(scheduler, reqs):
    """Two requests at the start, one after 3 steps, one after 6: admissions while in flight."""
    runs = [scheduler.submit(r) for r in reqs[:2]]
    steps = 0
    while scheduler.has_work or len(runs) < len(reqs):
        if steps in (3, 6) and len(runs) < len(reqs):
            runs.append(scheduler.submit(reqs[len(runs)]))
        scheduler.step()
        steps += 1
    scheduler.flush_releases()
    return [r.result for r in runs]


def tokens(results):
    return [[(s.token_ids, s.finish_reason) for s in r.sequences] for r in results]


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95)],
                         ids=["greedy", "sampled"])
@DEPTHS
def test_pipelined_output_equals_step_by_step(llama_target, sampling, depth):
    plain, overlapping, target = scheduler_pair(llama_target, depth=depth)
    commit = overlapping._commit

    def logged_commit(*args, **kwargs):
        target.events.append(("commit", None))
        return commit(*args, **kwargs)

    overlapping._commit = logged_commit
    want = run_staggered(plain, requests_that_stop_early(llama_target, sampling))
    got = run_staggered(overlapping, requests_that_stop_early(llama_target, sampling))
    assert tokens(got) == tokens(want)
    assert {s.finish_reason for r in got for s in r.sequences} == {FinishReason.STOP, FinishReason.LENGTH}
    # The pipeline was kept full: each answer was read with `depth` later calls already sent,
    # but for the calls near the end, whose sequences the calls in flight complete.
    events = target.events
    sends = [i for kind, i in events if kind == "send"]
    results = [i for kind, i in events if kind == "result"]
    assert results == sends, "every call is answered, in order"
    at = {event: n for n, event in enumerate(events) if event[0] != "commit"}
    ahead = [i for i in results if at.get(("send", i + depth), len(events)) < at[("result", i)]]
    assert len(ahead) >= len(results) - 2 * depth - 1, events
    assert all(at.get(("send", i + depth + 1), len(events)) > at[("result", i)] for i in results), \
        "never more than `depth` calls sent ahead of the answer read"
    assert not overlapping.target.runner.sequences, "every slot is released"
    assert overlapping.step_stats.committed_tokens == plain.step_stats.committed_tokens
    # A last call whose sequences had all finished is not a step: the counts match step by step.
    assert overlapping.step_stats.sequence_steps == plain.step_stats.sequence_steps
    assert overlapping.step_stats.steps == plain.step_stats.steps


@DEPTHS
def test_sequences_filling_the_cache_to_the_last_position_never_run_past_it(llama_target, depth):
    """A sequence whose length the steps in flight complete is left out of the next call, so it
    never runs past its last token on the worker, and a prompt + max_new_tokens of exactly
    max_seq_len fits."""
    plain = build_scheduler(llama_target, None, max_seq_len=32)
    base = build_scheduler(llama_target, None, max_seq_len=32)
    target = OverlappingTarget(base.target, steps_in_flight=depth)
    overlapping = Scheduler(target, None, base.codec, base.config)
    reqs = [GenerationRequest(prompt_ids=tuple(range(5, 5 + p)), max_new_tokens=32 - p, ignore_eos=True, n=n)
            for p, n in ((4, 2), (9, 1), (20, 1))]
    want = tokens(plain.generate(reqs))
    got = tokens(overlapping.generate(reqs))
    assert got == want
    assert [len(s) for r in got for s, _ in r] == [28, 28, 23, 12]
    assert not base.target.runner.sequences, "every slot is released"
    # Every sequence was sent in exactly as many calls as it has tokens.
    assert overlapping.step_stats.verify_tokens == 28 + 28 + 23 + 12


@DEPTHS
def test_cancel_while_in_flight_drops_the_sequence_and_frees_its_slot(llama_target, depth):
    plain, overlapping, target = scheduler_pair(llama_target, depth=depth)
    keep = GenerationRequest(prompt_ids=(5, 6, 7), max_new_tokens=12, ignore_eos=True)
    want = plain.generate([keep])[0].sequences[0].token_ids
    kept = overlapping.submit(keep)
    gone = overlapping.submit(GenerationRequest(prompt_ids=(9, 9), max_new_tokens=12, n=2, ignore_eos=True))
    for _ in range(3):
        overlapping.step()
    assert len(overlapping.regular.in_flight) == depth
    overlapping.cancel(gone)
    while overlapping.has_work:
        overlapping.step()
    overlapping.flush_releases()
    assert kept.result.sequences[0].token_ids == want
    assert all(len(s.output) <= 3 for s in gone.sequences), "nothing committed after the cancel"
    assert not overlapping.target.runner.sequences


@DEPTHS
def test_a_failure_in_flight_reaches_the_caller_and_fail_all_discards_it(llama_target, depth):
    _, overlapping, target = scheduler_pair(llama_target, fail_at=3, depth=depth)
    run = overlapping.submit(GenerationRequest(prompt_ids=(5, 6, 7), max_new_tokens=20, ignore_eos=True))
    with pytest.raises(WorkerUnavailableError):
        for _ in range(10):
            overlapping.step()
    assert overlapping.fail_all() == [run]
    assert target.events[-1 - depth:] == [("result", 3)] + [("discard", 3 + i) for i in range(1, depth + 1)], \
        target.events
    assert not overlapping.has_work


def test_regular_decoding_through_the_services_equals_in_process(llama_target, llama_draft):
    """The real services, whose target client overlaps calls on its session stream; requests
    sent at once from several clients, greedy and seeded sampling."""
    reqs = requests_that_stop_early(llama_target) + requests_that_stop_early(
        llama_target, SamplingParams(temperature=0.8, top_p=0.95))
    want = [[(list(s.token_ids), s.finish_reason.value) for s in r.sequences]
            for r in build_scheduler(llama_target, None).generate(reqs)]
    services = start_services(llama_target, llama_draft, policy="0")  # regular decoding
    try:
        def ask(r):
            with BassClient(services.address, timeout_s=60) as client:
                answer = client.generate(list(r.prompt_ids), n=r.n, max_new_tokens=r.max_new_tokens,
                                         stop_token_ids=list(r.stop_token_ids), ignore_eos=True, seed=r.seed,
                                         temperature=r.sampling.temperature, top_p=r.sampling.top_p)
            return [(list(s.token_ids), FINISH_REASON_NAMES[s.finish_reason]) for s in answer.sequences]

        with ThreadPoolExecutor(len(reqs)) as pool:
            got = list(pool.map(ask, reqs))
        assert got == want
        deadline = time.monotonic() + 10  # released once the coordinator is idle, after answering
        while services.target.engine.runner.sequences and time.monotonic() < deadline:
            time.sleep(0.05)
        assert services.target.engine.runner.sequences == {}, "every slot is released"
    finally:
        services.stop()


class ScriptedPolicy:
    """Regular decoding for steps 3-9, k = 3 otherwise (as `auto` switches)."""

    def __init__(self):
        self.step = 0

    def lengths(self, seq_ids, join=None):
        self.step += 1
        return [0 if 3 <= self.step <= 9 else 3] * len(seq_ids)

    def observe(self, *args):
        pass

    def observe_costs(self, *args, **kwargs):
        pass

    def forget(self, seq_id):
        pass


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95)],
                         ids=["greedy", "sampled"])
@DEPTHS
def test_regular_steps_chosen_with_the_draft_up_are_pipelined_too(llama_target, llama_draft, sampling, depth):
    """When the policy picks regular decoding for the batch while the draft is up, those steps
    keep a call in flight as well; speculation resuming commits it first. Lossless either way:
    the same tokens as step-by-step decoding with the same choices of k."""
    plain = build_scheduler(llama_target, llama_draft, draft_length="3")
    base = build_scheduler(llama_target, llama_draft, draft_length="3")
    target = OverlappingTarget(base.target, steps_in_flight=depth)
    overlapping = Scheduler(target, base.draft, base.codec, base.config)
    for s in (plain, overlapping):
        s.policy = ScriptedPolicy()
    want = run_staggered(plain, requests_that_stop_early(llama_target, sampling))
    got = run_staggered(overlapping, requests_that_stop_early(llama_target, sampling))
    assert tokens(got) == tokens(want)
    # The same speculation, before and after the regular steps, request by request.
    assert [r.stats.draft_tokens for r in got] == [r.stats.draft_tokens for r in want]
    assert overlapping.step_stats.draft_tokens > 0
    sends = [i for kind, i in target.events if kind == "send"]
    assert len(sends) == 7, "the seven regular steps, and only they, went through start_verify"
    assert any(target.events.index(("send", i + 1)) < target.events.index(("result", i)) for i in sends[:-1])
    assert not base.target.runner.sequences and not base.draft.runner.sequences, "every slot is released"


class RecordingPolicy(ScriptedPolicy):
    """ScriptedPolicy that keeps what the scheduler times: (policy step, k, verify seconds)."""

    def __init__(self):
        super().__init__()
        self.costs = []

    def observe_costs(self, batch, draft_forwards, draft_s, verify_k, verify_s, joined=0):
        self.costs.append((self.step, verify_k, verify_s))


@DEPTHS
def test_a_speculative_step_after_regular_ones_is_not_charged_for_their_answers(llama_target, llama_draft, depth):
    """Speculation resuming first reads the regular steps still in flight; that wait is theirs,
    not the speculative step's: the policy would take it for the cost of the length it resumed
    at. Each regular answer here takes 0.3 s to read; a speculative step of the tiny models
    takes milliseconds. The first step after regular decoding is not given to the policy at
    all (a change of length: Scheduler._commit_speculative); the ones after it are, at their
    own cost."""
    base = build_scheduler(llama_target, llama_draft, draft_length="3")
    target = OverlappingTarget(base.target, steps_in_flight=depth, result_delay=0.3)
    scheduler = Scheduler(target, base.draft, base.codec, base.config)
    scheduler.policy = policy = RecordingPolicy()
    scheduler.generate([GenerationRequest(prompt_ids=(5, 17, 33), max_new_tokens=40, ignore_eos=True)])
    resumed = [verify_s for step, k, verify_s in policy.costs if k > 0 and step > 9]
    assert len(resumed) >= 2, "speculation resumed after the regular steps"
    assert resumed[0] is None, policy.costs
    assert resumed[1] is not None and resumed[1] < 0.2, policy.costs
