"""The draft in the target's process (target_service/colocated.py, bass/transport/remote_pair.py):
real gRPC servers on real ports, the coordinator's scheduler over remote proxies. A speculative
step must be one Speculate call, the next step's proposal chained behind it where the draft's
loop runs it, and the text must be the in-process engine's token for token, greedy and sampled.
The draft's self-feeding loop runs eagerly here (its CUDA graphs capture the same functions)."""

import dataclasses

import grpc
import pytest
import torch

from bass.coordinator import speculative_ahead
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.tokenizer import load_codec
from bass.core.errors import PreconditionError
from bass.target_service import colocated
from bass.target_service.colocated import serve_workers
from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker
from bass.v1 import worker_pb2 as pb
from bass.v1 import worker_pb2_grpc
from conftest import build_gpu_scheduler, build_scheduler
from test_chained_drafts import texts, with_eager_loop
from test_device_drafts import REQUESTS


class Recorder:
    """Speculation.run, counting calls and those that verified a chained proposal, and the
    draft service's own proposals (Propose calls: the two-call path)."""

    def __init__(self, monkeypatch):
        self.calls, self.used_chain, self.chained, self.proposes = 0, 0, 0, 0
        original, original_propose = colocated.Speculation.run, colocated.ColocatedDraft.propose

        def run(speculation, request):
            response = original(speculation, request)
            self.calls += 1
            self.used_chain += request.propose is None
            self.chained += response.chained
            return response

        def propose(draft, request):
            self.proposes += 1
            return original_propose(draft, request)

        monkeypatch.setattr(colocated.Speculation, "run", run)
        monkeypatch.setattr(colocated.ColocatedDraft, "propose", propose)


def colocated_scheduler(target, draft, policy, *, loop=True, gpu=False, transport="session", **kw):
    """A scheduler over gRPC proxies of workers served from one server (this process), as the
    coordinator drives `bass serve`'s default; returns (scheduler, server). gpu: fp32 workers on
    the GPU with their CUDA graphs (the draft's loop captured)."""
    workers = build_gpu_scheduler(target, draft, policy) if gpu else build_scheduler(target, draft, policy, **kw)
    if loop and not gpu:
        with_eager_loop(workers)
    server = serve_workers(workers.target, workers.draft)
    d = RemoteDraftWorker(server.address, transport=transport)
    t = RemoteTargetWorker(server.address, transport=transport, draft=d)
    scheduler = Scheduler(t, d, load_codec(target), workers.config)
    return scheduler, server


@pytest.mark.parametrize("policy, transport", [("3", "session"), ("auto", "session"), ("3", "unary")])
def test_one_call_a_step_gives_the_in_process_text(llama_target, llama_draft, policy, transport, monkeypatch):
    """Over the session stream (the default) and as unary Speculate RPCs."""
    want = texts(with_eager_loop(build_scheduler(llama_target, llama_draft, policy)).generate(REQUESTS))
    calls = Recorder(monkeypatch)
    scheduler, server = colocated_scheduler(llama_target, llama_draft, policy, transport=transport)
    try:
        assert scheduler.target.verifies_device_drafts, "the proxies found one process behind both"
        got = scheduler.generate(REQUESTS)
    finally:
        server.stop(0)
    assert texts(got) == want
    assert calls.calls >= 5 and calls.chained >= 3 and calls.used_chain >= 3, vars(calls)
    if policy == "3":  # one length for every sequence: every speculative step is one call
        assert calls.proposes == 0, vars(calls)
    assert sum(r.stats.accepted_tokens for r in got) > 0 and sum(r.stats.rejections for r in got) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["3", "auto"])
def test_through_cuda_graphs_one_call_a_step_gives_the_in_process_text(llama_target, llama_draft, policy,
                                                                     monkeypatch):
    want = texts(build_gpu_scheduler(llama_target, llama_draft, policy).generate(REQUESTS))
    calls = Recorder(monkeypatch)
    scheduler, server = colocated_scheduler(llama_target, llama_draft, policy, gpu=True)
    try:
        got = texts(scheduler.generate(REQUESTS))
    finally:
        server.stop(0)
    assert got == want
    assert calls.chained >= 3 and calls.used_chain >= 3, vars(calls)
    # Steps sent before the last answer was read (coordinator/speculative_ahead.py), through
    # the worker's CUDA graphs.
    assert scheduler.step_stats.sent_ahead_steps >= 1, vars(scheduler.step_stats)


def test_without_the_draft_loop_steps_are_not_chained(llama_target, llama_draft, monkeypatch):
    """On a CPU worker the draft has no self-feeding loop: the worker declines every chain
    (SpeculateResponse.chained false) and each step sends its proposal; same text."""
    want = texts(build_scheduler(llama_target, llama_draft, "3").generate(REQUESTS))
    calls = Recorder(monkeypatch)
    scheduler, server = colocated_scheduler(llama_target, llama_draft, "3", loop=False)
    try:
        got = texts(scheduler.generate(REQUESTS))
    finally:
        server.stop(0)
    assert got == want
    assert calls.calls >= 5 and calls.chained == 0 and calls.used_chain == 0


def test_separate_processes_are_not_paired(llama_target, llama_draft):
    """A draft and a target served apart report different instance ids: two calls a step."""
    from bass.core.config import WorkerServiceConfig
    from bass.draft_service import server as draft_server
    from bass.target_service import server as target_server

    target = target_server.serve(WorkerServiceConfig(model_dir=llama_target, num_slots=4, max_seq_len=128))
    draft = draft_server.serve(WorkerServiceConfig(model_dir=llama_draft, num_slots=4, max_seq_len=128))
    try:
        d = RemoteDraftWorker(draft.address)
        t = RemoteTargetWorker(target.address, draft=d)
        assert t.info().instance_id and d.info().instance_id
        assert t.info().instance_id != d.info().instance_id
        assert not t.verifies_device_drafts
    finally:
        target.stop(0)
        draft.stop(0)


def test_a_draft_call_of_its_own_drops_the_chained_proposal(llama_target, llama_draft, monkeypatch):
    """A chained proposal was queued on the draft's state as the last Speculate left it: after
    any other draft call, verifying it is refused (FAILED_PRECONDITION), not silently wrong.
    (No step is sent ahead here: the chain waits for the next step, as the test's own call.)"""
    monkeypatch.setattr(speculative_ahead, "plan_ahead", lambda *args: None)
    scheduler, server = colocated_scheduler(llama_target, llama_draft, "3")
    try:
        request = dataclasses.replace(REQUESTS[0], max_new_tokens=40)
        run = scheduler.submit(request)
        for _ in range(4):
            scheduler.step()
        assert scheduler._chain is not None, "a proposal is chained for the next step"
        seq_ids = [s.seq_id for s in run.sequences]
        scheduler.draft.release([])  # a call of the draft's own, through its service
        channel = grpc.insecure_channel(server.address)
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        sampling = pb.SamplingColumns(temperature=[0.0] * 2, top_k=[0] * 2, top_p=[1.0] * 2, seed_key=[1, 2])
        with pytest.raises(grpc.RpcError) as e:
            stub.Speculate(pb.SpeculateRequest(use_chained=True, verify=pb.VerifyRequest(
                seq_ids=seq_ids, draft_counts=[0, 0], sampling=sampling)))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "chained" in e.value.details()
        channel.close()
    finally:
        server.stop(0)


def _columns(n):
    return pb.SamplingColumns(temperature=[0] * n, top_k=[0] * n, top_p=[1] * n, seed_key=list(range(n)))


def _verify(*seq_ids):
    return pb.VerifyRequest(seq_ids=seq_ids, draft_counts=[0] * len(seq_ids), sampling=_columns(len(seq_ids)))


def _propose(seq_ids, num_tokens):
    return pb.ProposeRequest(seq_ids=seq_ids, num_tokens=num_tokens, committed_counts=[0] * len(seq_ids),
                             sampling=_columns(len(seq_ids)))


@pytest.mark.parametrize("request_fields, field", [
    (dict(use_chained=True, propose=pb.ProposeRequest()), "propose"),
    (dict(verify=pb.VerifyRequest(seq_ids=[1], draft_counts=[1], draft_tokens=[5], sampling=_columns(1)),
          propose=pb.ProposeRequest()), "draft_tokens"),
    (dict(verify=_verify(1, 2), propose=_propose([1, 2], [3, 2])), "propose.num_tokens"),
    (dict(verify=_verify(1, 2), propose=_propose([2, 1], [3, 3])), "propose.seq_ids"),
    (dict(verify=_verify(1, 2), propose=_propose([1, 2], [3, 3]), chain=_propose([1], [3])), "chain.seq_ids"),
])
def test_malformed_speculate_is_invalid_argument(llama_target, llama_draft, request_fields, field):
    """Refused before any work is queued (the sequences named need not even exist)."""
    scheduler, server = colocated_scheduler(llama_target, llama_draft, "3", loop=False)
    try:
        stub = worker_pb2_grpc.TargetWorkerStub(grpc.insecure_channel(server.address))
        with pytest.raises(grpc.RpcError) as e:
            stub.Speculate(pb.SpeculateRequest(**request_fields))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details()
    finally:
        server.stop(0)


def test_a_target_without_a_draft_refuses_speculate(llama_target):
    from bass.core.config import WorkerServiceConfig
    from bass.target_service import server as target_server

    target = target_server.serve(WorkerServiceConfig(model_dir=llama_target, num_slots=4, max_seq_len=128))
    try:
        t = RemoteTargetWorker(target.address)
        with pytest.raises(PreconditionError, match="no draft in its process"):
            t.start_speculate(pb.SpeculateRequest(propose=pb.ProposeRequest(), verify=pb.VerifyRequest())).result()
    finally:
        target.stop(0)


def test_a_draft_that_answers_late_is_paired_once_it_does(llama_target, llama_draft, monkeypatch):
    """The pair is known only once both proxies have an Info from one process: a draft that
    was unreachable when the scheduler started is paired when it reconnects, not left on the
    two-call path."""
    from bass.core.errors import WorkerUnavailableError

    scheduler, server = colocated_scheduler(llama_target, llama_draft, "3")
    try:
        draft, target = scheduler.draft, scheduler.target
        calls = {"n": 0}
        real_info = RemoteDraftWorker.info

        def info(self, timeout_s=None):
            calls["n"] += 1
            if calls["n"] == 1:
                raise WorkerUnavailableError("not yet")
            return real_info(self, timeout_s)

        monkeypatch.setattr(RemoteDraftWorker, "info", info)
        draft.instance_id = ""
        late = Scheduler(target, draft, load_codec(llama_target), scheduler.config, reconnect_interval_s=0.0)
        assert not late.draft_up and not late.speculative.fed_verify
        late.check_draft()
        assert late.draft_up and late.speculative.fed_verify and late.speculative.chains
    finally:
        server.stop(0)



@pytest.mark.parametrize("tail,alone", [(2, False), (6, True)], ids=["tail-2", "tail-6-one-sequence"])
def test_lookup_tokens_after_a_colocated_drafts_proposal_keep_the_text(llama_target, llama_draft, monkeypatch,
                                                                       tail, alone):
    """`bass serve --lookup-tail 2`'s path: the target process appends lookup tokens to the
    draft's proposal it verifies and chains the next proposal behind them; the coordinator
    sees longer verdicts only. The text is regular decoding's; the target takes some lookups.
    With --lookup-tail 6 and one sequence, up to 4 follow k = 3 drafts (a verification of 8 rows)."""
    from test_chained_drafts import REPETITIVE

    from bass.target_service import worker as target_worker

    requests = REPETITIVE[:1] if alone else REPETITIVE
    want = texts(build_scheduler(llama_target, None, "0").generate(requests))
    appended = []  # lookup tokens a verification appended a sequence
    real_lookup = target_worker.lookup_tail
    monkeypatch.setattr(target_worker, "lookup_tail", lambda text, drafts, m: appended.append(m) or real_lookup(
        text, drafts, m))
    calls = Recorder(monkeypatch)
    scheduler, server = colocated_scheduler(llama_target, llama_draft, "3", lookup_tail=tail)
    try:
        got = scheduler.generate(requests)
    finally:
        server.stop(0)
    assert texts(got) == want
    assert scheduler.step_stats.lookup_tail_kept > 0
    assert calls.chained >= 3 and calls.used_chain >= 3, vars(calls)
    # Within graph_max_draft after k = 3 and, at one sequence, within 8 rows.
    assert max(appended) == min(tail, 8 - 3, 7 - 3 if alone else 8), appended
