"""Failures: the draft dies (carry on without it, reconnect), the target dies (fail fast,
recover), the queue is full (RESOURCE_EXHAUSTED). No request is lost or answered twice."""

import threading
import time

import grpc
import pytest

from bass.app.client import BassClient
from bass.coordinator.requests import GenerationRequest
from conftest import build_scheduler
from services import run_at_once, start_services

PROMPT = [5, 17, 33, 200, 7]


@pytest.fixture
def services(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft, policy="3")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def expected(llama_target):
    (r,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=tuple(PROMPT), max_new_tokens=40, ignore_eos=True)])
    return r.sequences[0].token_ids


def first_answer_after_restart(client, timeout_s: float = 20.0):
    """Retry PROMPT until the coordinator reconnects to a restarted target (UNAVAILABLE meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
            time.sleep(0.2)


@pytest.mark.parametrize("stream", [0, 3])
def test_draft_death_falls_back_to_regular_decoding_then_reconnects(llama_target, llama_draft, expected, stream):
    """stream 3: streamed speculation, the draft in its process drafting ahead on its own while the
    target verifies: it dies mid-stream, and comes back, with the same text throughout."""
    services = start_services(llama_target, llama_draft, policy="3", stream={"block": stream, "wait_ms": 200})
    try:
        _draft_death_then_reconnect(services, expected)
    finally:
        services.stop()


def _draft_death_then_reconnect(services, expected):
    with BassClient(services.address, timeout_s=60) as client:
        before = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert list(before.sequences[0].token_ids) == expected and before.stats.draft_tokens > 0

        # Kill the draft while a stream is running: the stream must finish, correctly.
        stream = client.stream_raw(PROMPT, n=2, max_new_tokens=40, ignore_eos=True)
        first = next(stream)
        services.draft.stop(grace_s=0)
        rest = list(stream)
        tokens = {}
        for m in [first] + rest:
            for d in m.deltas:
                tokens.setdefault(d.index, []).extend(d.token_ids)
        assert tokens == {0: expected, 1: expected}

        during = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert list(during.sequences[0].token_ids) == expected and during.stats.draft_tokens == 0

        services.restart_draft()
        deadline = time.monotonic() + 20
        while True:
            after = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
            assert list(after.sequences[0].token_ids) == expected
            if after.stats.draft_tokens > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert after.stats.draft_tokens > 0, "speculation should resume once the draft is back"


def test_target_death_fails_fast_then_recovers(services, expected):
    with BassClient(services.address, timeout_s=30) as client:
        assert list(client.generate(PROMPT, max_new_tokens=40, ignore_eos=True).sequences[0].token_ids) == expected
        services.target.stop(grace_s=0)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t0 < 10
        with pytest.raises(grpc.RpcError) as info:  # still down: refused at once
            client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        services.restart_target()
        assert list(first_answer_after_restart(client).sequences[0].token_ids) == expected


def stop_target_mid_stream(services, client) -> None:
    """Stop the target while a stream runs: the stream fails UNAVAILABLE, promptly."""
    stream = client.stream_raw(PROMPT, n=2, max_new_tokens=400, ignore_eos=True)
    next(stream)
    t0 = time.monotonic()
    services.target.stop(grace_s=0)
    with pytest.raises(grpc.RpcError) as info:
        list(stream)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t0 < 10


def test_target_death_with_a_call_in_flight_fails_the_stream_then_recovers(llama_target, llama_draft, expected):
    """Regular decoding keeps a Verify in flight (coordinator/regular_pipeline.py): the target dying
    mid-stream fails that stream UNAVAILABLE, promptly, and the next request after the restart
    is answered exactly, by a coordinator that was never restarted."""
    s = start_services(llama_target, llama_draft, policy="0")
    try:
        with BassClient(s.address, timeout_s=30) as client:
            stop_target_mid_stream(s, client)
            s.restart_target()
            r = first_answer_after_restart(client)
            assert list(r.sequences[0].token_ids) == expected and r.stats.draft_tokens == 0
    finally:
        s.stop()


def test_a_colocated_pair_dying_fails_fast_then_recovers_with_speculation(llama_target, llama_draft, expected):
    """The draft in the target's process (`bass serve`'s default): the two go down and come back
    together. A stream in flight fails UNAVAILABLE promptly; after the restart the coordinator
    (never restarted) answers exactly, and speculates again, paired, once the draft reconnects."""
    s = start_services(llama_target, llama_draft, policy="3", colocate=True)
    try:
        with BassClient(s.address, timeout_s=30) as client:
            r = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
            assert list(r.sequences[0].token_ids) == expected and r.stats.draft_tokens > 0
            stop_target_mid_stream(s, client)
            s.restart_target()
            # The draft is probed on a fresh stream as the target reconnects: the first answer
            # after the restart already speculates.
            r = first_answer_after_restart(client)
            assert list(r.sequences[0].token_ids) == expected and r.stats.draft_tokens > 0
            scheduler = s.coordinator.engine.scheduler
            assert scheduler.target.verifies_device_drafts and scheduler.speculative.fed_verify, "paired again"
    finally:
        s.stop()


def test_full_queue_is_resource_exhausted_and_nothing_is_lost(llama_target, llama_draft, expected):
    s = start_services(llama_target, llama_draft, policy="3", max_batch_size=1, num_slots=1, max_waiting=1)
    outcomes, lock = [], threading.Lock()

    def call(_):
        with BassClient(s.address, timeout_s=120) as c:
            try:
                r = c.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
                outcome = ("ok", list(r.sequences[0].token_ids))
            except grpc.RpcError as e:
                outcome = (e.code(), e.details())
        with lock:
            outcomes.append(outcome)

    try:
        run_at_once(call, 12)
    finally:
        s.stop()
    assert len(outcomes) == 12  # every call answered exactly once
    ok = [o for o in outcomes if o[0] == "ok"]
    refused = [o for o in outcomes if o[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(ok) + len(refused) == 12
    assert ok and refused and all(o[1] == expected for o in ok)
    assert "queue is full" in refused[0][1]


def test_health_answers_while_a_step_runs(services):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    worker = services.target.engine
    original, original_start = worker.verify, worker.start_verify

    def slow_verify(request):
        time.sleep(0.5)
        return original(request)

    def slow_start_verify(request):
        time.sleep(0.5)
        return original_start(request)

    worker.verify, worker.start_verify = slow_verify, slow_start_verify
    try:
        with BassClient(services.address, timeout_s=60) as client:
            call = threading.Thread(target=client.generate, args=(PROMPT,), kwargs=dict(max_new_tokens=4))
            call.start()
            time.sleep(0.2)
            stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(services.target.address))
            t0 = time.monotonic()
            reply = stub.Check(health_pb2.HealthCheckRequest(service="bass.v1.TargetWorker"), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert time.monotonic() - t0 < 0.3, "health must not wait for the model"
            call.join(30)
    finally:
        worker.verify, worker.start_verify = original, original_start


def test_graceful_shutdown_finishes_in_flight_calls(services, expected):
    with BassClient(services.address, timeout_s=60) as client:
        stream = client.stream_raw(PROMPT, max_new_tokens=40, ignore_eos=True)
        first = next(stream)
        stopper = threading.Thread(target=services.coordinator.server.stop, args=(20,))
        stopper.start()
        rest = list(stream)  # the call in flight completes normally
        tokens = [t for m in [first] + rest for d in m.deltas for t in d.token_ids]
        assert tokens == expected and rest[-1].HasField("stats")
        stopper.join(30)
        with pytest.raises(grpc.RpcError) as info:  # new calls are refused once stopped
            client.generate(PROMPT, max_new_tokens=4)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
