"""Speculative steps sent ahead over a co-located pair (coordinator/speculative_ahead.py): step
t + 1's Speculate call goes out before step t's answer is read, on the proposal the worker
chains behind t. Real gRPC servers on real ports, the draft's self-feeding loop run eagerly.

What must hold: the text is the in-process engine's token for token, greedy and seeded; a step
sent ahead of a chain the worker declined, or one the worker refuses, is dropped and planned
anew; cancellations, arrivals and a cache filled to its last position work as without; a
target that dies fails the requests and leaves nothing in flight; nothing is left held on either
worker."""

import dataclasses

import pytest

from bass.coordinator.requests import FinishReason, GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.config import SamplingParams
from bass.core.errors import PreconditionError, WorkerUnavailableError
from bass.target_service import colocated
from bass.target_service.colocated import serve_workers
from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker
from conftest import build_scheduler
from test_chained_drafts import texts, with_eager_loop
from test_device_drafts import REQUESTS


class Served:
    """A scheduler over gRPC proxies of in-process workers served from one server (this
    process), as the coordinator drives `bass serve`'s default."""

    def __init__(self, target, draft, policy, **kw):
        self.workers = with_eager_loop(build_scheduler(target, draft, policy, **kw))
        self.server = serve_workers(self.workers.target, self.workers.draft)
        d = RemoteDraftWorker(self.server.address)
        t = RemoteTargetWorker(self.server.address, draft=d)
        self.scheduler = Scheduler(t, d, load_codec(target), self.workers.config)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.stop(0)

    def holds_nothing(self) -> bool:
        return not self.workers.target.runner.sequences and not self.workers.draft.runner.sequences


def in_process(target, draft, policy, requests, **kw):
    return texts(with_eager_loop(build_scheduler(target, draft, policy, **kw)).generate(requests))


@pytest.mark.parametrize("policy", ["3", "auto"])
def test_steps_sent_ahead_give_the_in_process_text(llama_target, llama_draft, policy):
    want = in_process(llama_target, llama_draft, policy, REQUESTS)
    with Served(llama_target, llama_draft, policy) as served:
        s = served.scheduler
        assert s.target.speculates_ahead
        got = texts(s.generate(REQUESTS))
        st = s.step_stats
        assert got == want
        assert st.dropped_ahead_steps == 0
        if policy == "3":  # one length throughout: most steps run on a chain, most of those sent ahead
            assert st.sent_ahead_steps >= st.steps // 2, (st.sent_ahead_steps, st.steps)
        else:  # auto times regular decoding and probes lengths, which breaks the chain
            assert st.sent_ahead_steps >= 2, (st.sent_ahead_steps, st.steps)
        assert st.sent_ahead_steps <= st.chained_steps
        assert served.holds_nothing()


def test_over_unary_calls_nothing_is_sent_ahead(llama_target, llama_draft):
    """A unary call is answered before the next is made: nothing to overlap."""
    with Served(llama_target, llama_draft, "3") as served:
        d = RemoteDraftWorker(served.server.address, transport="unary")
        t = RemoteTargetWorker(served.server.address, transport="unary", draft=d)
        s = Scheduler(t, d, load_codec(llama_target), served.workers.config)
        assert not t.speculates_ahead
        assert texts(s.generate(REQUESTS)) == in_process(llama_target, llama_draft, "3", REQUESTS)
        assert s.step_stats.chained_steps >= 3 and s.step_stats.sent_ahead_steps == 0


def test_a_chain_the_worker_declines_drops_the_step_sent_ahead_of_it(llama_target, llama_draft):
    """The worker declines two chains (as it does a shape its graphs do not run): the step sent
    ahead of each is dropped before it runs, planned anew with a proposal of its own, and the
    text holds."""
    want = in_process(llama_target, llama_draft, "3", REQUESTS)
    with Served(llama_target, llama_draft, "3") as served:
        chains, asked = served.workers.draft.chains, []

        def two_declined(*args):
            asked.append(args)
            return len(asked) not in (4, 9) and chains(*args)

        served.workers.draft.chains = two_declined
        s = served.scheduler
        assert texts(s.generate(REQUESTS)) == want
        assert s.step_stats.dropped_ahead_steps == 2 and s.step_stats.sent_ahead_steps >= 2, vars(s.step_stats)
        assert served.holds_nothing()


def test_a_step_sent_ahead_that_the_worker_refuses_is_planned_anew(llama_target, llama_draft, monkeypatch):
    """The worker said it chained a proposal, then lost it (here: dropped before the step that
    was to use it): that step and the one sent ahead of it are refused (FAILED_PRECONDITION);
    the scheduler drops both, plans the step again with a proposal of its own, and the text holds."""
    want = in_process(llama_target, llama_draft, "3", REQUESTS)
    run, calls = colocated.Speculation.run, []

    def losing_the_fourth_chain(speculation, request):
        if request.propose is None:
            calls.append(request)
            if len(calls) == 4:
                speculation.drop_chain()
        return run(speculation, request)

    monkeypatch.setattr(colocated.Speculation, "run", losing_the_fourth_chain)
    with Served(llama_target, llama_draft, "3") as served:
        s = served.scheduler
        assert texts(s.generate(REQUESTS)) == want
        assert s.step_stats.dropped_ahead_steps == 2, vars(s.step_stats)
        assert served.holds_nothing()


def test_cancellations_and_arrivals_while_steps_are_sent_ahead(llama_target, llama_draft):
    """A request cancelled while a step is in flight ahead stops there and its slots are freed;
    an arrival joins within three steps; the others' text is what it is alone (fp32)."""
    first = dataclasses.replace(REQUESTS[0], max_new_tokens=40)
    alone = [in_process(llama_target, llama_draft, "3", [r])[0] for r in (REQUESTS[1], REQUESTS[2])]
    with Served(llama_target, llama_draft, "3") as served:
        s = served.scheduler
        runs = [s.submit(first), s.submit(REQUESTS[1])]
        for _ in range(4):
            s.step()
        assert s._ahead is not None, "a step is in flight ahead"
        s.cancel(runs[0])
        runs.append(s.submit(REQUESTS[2]))
        steps_to_admit = 0
        while runs[2].started is None:
            s.step()
            steps_to_admit += 1
        # The step in flight ahead, then the one already chained behind it (whose chain was
        # planned before the arrival), then the arrival's.
        assert steps_to_admit <= 3
        while s.has_work:
            s.step()
        s.flush_releases()
        assert all(q.finish_reason == FinishReason.CANCELLED for q in runs[0].sequences)
        assert len(runs[0].sequences[0].output) < 40
        assert [texts([r.result])[0] for r in runs[1:]] == alone
        assert s.step_stats.sent_ahead_steps >= 2
        assert served.holds_nothing()


def test_a_cache_filled_to_its_last_position(llama_target, llama_draft):
    """Prompt plus max_new_tokens is the cache's whole length: nothing is sent ahead past it."""
    requests = [GenerationRequest(prompt_ids=(5, 17, 33, 5, 17, 33, 5, 17), max_new_tokens=40, ignore_eos=True),
                GenerationRequest(prompt_ids=(9, 8, 7, 9), max_new_tokens=44, ignore_eos=True, seed=4,
                                  sampling=SamplingParams(temperature=0.3))]
    want = in_process(llama_target, llama_draft, "3", requests, max_seq_len=48)
    with Served(llama_target, llama_draft, "3", max_seq_len=48) as served:
        s = served.scheduler
        assert texts(s.generate(requests)) == want
        assert [len(t[0]) for t in want] == [40, 44]
        assert s.step_stats.sent_ahead_steps >= 2 and s.step_stats.dropped_ahead_steps == 0
        assert served.holds_nothing()


def test_a_target_that_dies_with_a_step_in_flight_ahead(llama_target, llama_draft):
    """The pair's process goes away while a step is in flight ahead: the scheduler raises
    WorkerUnavailableError, and fail_all hands back the request and leaves nothing in flight."""
    with Served(llama_target, llama_draft, "3") as served:
        s = served.scheduler
        run = s.submit(dataclasses.replace(REQUESTS[0], max_new_tokens=60))
        for _ in range(4):
            s.step()
        assert s._ahead is not None
        served.server.stop(0)
        with pytest.raises(WorkerUnavailableError):
            for _ in range(20):
                s.step()
        assert s.fail_all() == [run]
        assert s._ahead is None and not s.has_work


def test_a_failed_step_drops_the_step_sent_ahead_of_it(llama_target, llama_draft, monkeypatch):
    """The worker fails a step (INTERNAL) while the next one was already sent: the scheduler
    raises WorkerUnavailableError, and the step sent ahead is dropped with it, not left for a
    reader that never comes."""
    from bass.coordinator.speculative_step import LaunchedStep

    run, calls, dropped = colocated.Speculation.run, [], []

    def failing_the_fifth_chain(speculation, request):
        if request.propose is None:
            calls.append(request)
            if len(calls) == 5:
                raise RuntimeError("a worker bug")
        return run(speculation, request)

    discard = LaunchedStep.discard

    def counted(step):
        dropped.append(step)
        discard(step)

    monkeypatch.setattr(colocated.Speculation, "run", failing_the_fifth_chain)
    monkeypatch.setattr(LaunchedStep, "discard", counted)
    with Served(llama_target, llama_draft, "3") as served:
        s = served.scheduler
        request = s.submit(dataclasses.replace(REQUESTS[0], max_new_tokens=60))
        with pytest.raises(WorkerUnavailableError):
            for _ in range(30):
                s.step()
        assert len(calls) >= 5 and dropped, "the step sent ahead of the failed one was dropped"
        assert s.fail_all() == [request] and s._ahead is None


def test_refusal_is_only_for_steps_sent_ahead():
    """A refused call of a step planned after the last answer is the draft's failure, as before
    (the step then decodes regularly); only a step sent ahead is dropped and planned anew."""
    from bass.coordinator.speculative_step import ChainRefused, LaunchedStep, SpeculativeStep, StepPlan

    class Refused:
        on_device, draft_s = None, None

        def result(self):
            raise PreconditionError("no proposal was chained")

    failures = []
    step = SpeculativeStep(target=None, draft=None, clock=lambda: 0.0, draft_failed=failures.append)
    ahead = LaunchedStep(plan=StepPlan(batch=[], lengths=[], step_started=0.0, target_add=[], target_release=[],
                                       sent_ahead=True), lengths=[], proposal=Refused())
    with pytest.raises(ChainRefused):
        step.finish(ahead)
    assert not failures
