"""The three real gRPC services on localhost ports, driven through the public API."""

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bass.app.client import BassClient, FINISH_REASON_NAMES
from bass.coordinator.requests import GenerationRequest
from conftest import build_scheduler
from services import run_at_once, start_services

PROMPTS = [(5, 17, 33, 200, 7, 9, 11), (42,), tuple(range(3, 22)), (100, 101)]


@pytest.fixture(scope="module")
def services(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def expected(llama_target):
    """What the in-process engine (regular decoding) produces."""
    results = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=p, max_new_tokens=24, ignore_eos=True) for p in PROMPTS])
    return [r.sequences[0].token_ids for r in results]


@pytest.fixture
def client(services):
    with BassClient(services.address, timeout_s=60) as c:
        yield c


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_greedy_output_equals_in_process_engine(client, expected):
    for prompt, want in zip(PROMPTS, expected):
        r = client.generate(list(prompt), n=2, max_new_tokens=24, ignore_eos=True)
        assert [list(s.token_ids) for s in r.sequences] == [want, want]
        assert [s.index for s in r.sequences] == [0, 1]
        assert r.stats.generated_tokens == 48 and r.stats.draft_tokens > 0 and r.stats.steps >= 1


def test_streaming_adds_up_to_the_unary_answer(client, expected):
    full = client.generate(list(PROMPTS[0]), n=3, max_new_tokens=24, ignore_eos=True)
    messages = list(client.stream_raw(list(PROMPTS[0]), n=3, max_new_tokens=24, ignore_eos=True))
    assert len(messages) > 2 and messages[-1].HasField("stats") and not messages[-1].deltas
    tokens, texts, reasons = {}, {}, {}
    for m in messages[:-1]:
        for d in m.deltas:
            tokens.setdefault(d.index, []).extend(d.token_ids)
            texts[d.index] = texts.get(d.index, "") + d.text
            if d.finish_reason:
                reasons[d.index] = FINISH_REASON_NAMES[d.finish_reason]
    for s in full.sequences:
        assert tokens[s.index] == list(s.token_ids) == expected[0]
        assert texts[s.index] == s.text
        assert reasons[s.index] == "length"


def test_text_prompt_and_stop_string(client):
    r = client.generate("def fibonacci(n):", max_new_tokens=30, ignore_eos=True)
    text = r.sequences[0].text
    assert len(text) > 6
    stop = text[3:6]
    cut = client.generate("def fibonacci(n):", max_new_tokens=30, ignore_eos=True, stop=[stop])
    assert cut.sequences[0].text == text[:text.find(stop)]
    assert FINISH_REASON_NAMES[cut.sequences[0].finish_reason] == "stop"


def test_streamed_text_with_a_stop_string_adds_up_to_the_cut_text(client):
    text = client.generate("def fibonacci(n):", max_new_tokens=30, ignore_eos=True).sequences[0].text
    stop = text[len(text) // 2:len(text) // 2 + 4]
    messages = list(client.stream_raw("def fibonacci(n):", max_new_tokens=30, ignore_eos=True, stop=[stop]))
    streamed = "".join(d.text for m in messages for d in m.deltas)
    assert streamed == text[:text.find(stop)]


def test_sampling_with_seed_is_reproducible_and_n_sequences_differ(client):
    opts = dict(n=4, max_new_tokens=16, temperature=1.0, top_p=0.95, seed=42, ignore_eos=True)
    a, b = client.generate(list(PROMPTS[0]), **opts), client.generate(list(PROMPTS[0]), **opts)
    assert [list(s.token_ids) for s in a.sequences] == [list(s.token_ids) for s in b.sequences]
    assert len({tuple(s.token_ids) for s in a.sequences}) > 1


def test_many_concurrent_clients_get_their_own_answers(services, expected):
    results, errors = {}, []

    def worker(i):
        try:
            with BassClient(services.address, timeout_s=120) as c:
                k = i % len(PROMPTS)
                r = c.generate(list(PROMPTS[k]), n=1 + i % 3, max_new_tokens=24, ignore_eos=True)
                results[i] = (k, [list(s.token_ids) for s in r.sequences])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_at_once(worker, 24)
    assert not errors and len(results) == 24
    for i, (k, seqs) in results.items():
        assert len(seqs) == 1 + i % 3 and all(s == expected[k] for s in seqs)


def test_time_budget_returns_what_finished_and_marks_the_rest(client):
    r = client.generate(list(PROMPTS[0]), n=2, max_new_tokens=400, ignore_eos=True, time_budget_ms=150)
    assert [FINISH_REASON_NAMES[s.finish_reason] for s in r.sequences] == ["time_budget"] * 2
    assert all(len(s.token_ids) < 400 for s in r.sequences)
    assert r.stats.time_ms < 5000
    ok = client.generate(list(PROMPTS[1]), max_new_tokens=5, ignore_eos=True, time_budget_ms=60_000)
    assert FINISH_REASON_NAMES[ok.sequences[0].finish_reason] == "length"


def target_sequences(services):
    return len(services.target.engine.runner.sequences)


def draft_sequences(services):
    return len(services.draft.engine.runner.sequences)


def test_cancelled_stream_frees_every_kv_slot(services, client):
    stream = client.stream_raw(list(PROMPTS[2]), n=4, max_new_tokens=400, ignore_eos=True)
    next(stream)
    assert wait_until(lambda: target_sequences(services) == 4)
    stream.cancel()
    assert wait_until(lambda: target_sequences(services) == 0 and draft_sequences(services) == 0)


def test_deadline_frees_every_kv_slot(services):
    with BassClient(services.address, timeout_s=0.3) as c:
        with pytest.raises(grpc.RpcError) as info:
            c.generate(list(PROMPTS[2]), n=3, max_new_tokens=450, ignore_eos=True)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until(lambda: target_sequences(services) == 0 and draft_sequences(services) == 0)


@pytest.mark.parametrize("options,field", [
    (dict(prompt=""), "prompt"),
    (dict(prompt=[5, 999999]), "prompt_ids"),
    (dict(n=100), "n"),
    (dict(max_new_tokens=100000), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(stop=[""]), "stop"),
])
def test_bad_input_is_invalid_argument_naming_the_field(client, options, field):
    prompt = options.pop("prompt", [5, 6])
    with pytest.raises(grpc.RpcError) as info:
        client.generate(prompt, **options)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field)


def test_missing_prompt_is_invalid_argument(services):
    from bass.v1 import generation_pb2, generation_pb2_grpc

    stub = generation_pb2_grpc.GenerationStub(grpc.insecure_channel(services.address))
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(generation_pb2.GenerateRequest(n=1), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt" in info.value.details()


def test_health_and_reflection(services):
    for address, name in [(services.address, "bass.v1.Generation"), (services.target.address, "bass.v1.TargetWorker"),
                          (services.draft.address, "bass.v1.DraftWorker")]:
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(services.address))
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert "bass.v1.Generation" in names and "grpc.health.v1.Health" in names
