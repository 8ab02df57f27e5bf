"""Issue #16: what a new user broke by trying hard. Real servers on free localhost ports, tiny
models, the CPU; each test is bounded in time.

1. SIGTERM drains: NOT_SERVING, running requests finish within the grace period, the rest
   UNAVAILABLE, exit 0 within grace + 1 s.
2. Sizes are checked before any work; the public API takes at most 4 MiB.
3. Extreme sampling values: tiny temperatures are greedy, nothing valid gives NaN.
4. Reconnects within the interval plus one probe, however long the outage.
5. The queue limit is hard.
6. Undecodable messages: one rate-limited line; the draft gauge is right from the start.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from dataclasses import asdict

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bass.app.client import BassClient, build_request
from bass.coordinator.requests import GenerationRequest
from bass.core.config import GREEDY_TEMPERATURE, CoordinatorConfig, SamplingParams, SchedulerConfig, DraftLengthConfig
from bass.core.errors import InvalidRequestError
from conftest import build_scheduler
from services import start_services

PROMPT = [5, 17, 33, 200, 7]


@pytest.fixture(scope="module")
def expected(llama_target):
    """Greedy output of PROMPT, 40 tokens, from the target alone (in-process)."""
    (r,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=tuple(PROMPT), max_new_tokens=40, ignore_eos=True)])
    return r.sequences[0].token_ids


def _slow_verify(worker, delay_s: float):
    """Every Verify takes delay_s longer: unpipelined ones and those regular decoding pipelines."""
    original, original_start = worker.verify, worker.start_verify

    def verify(request):
        time.sleep(delay_s)
        return original(request)

    def start_verify(request):
        time.sleep(delay_s)
        return original_start(request)

    worker.verify, worker.start_verify = verify, start_verify


def _health(address: str, service: str = "bass.v1.Generation") -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=2).status


# -- 1. SIGTERM -------------------------------------------------------------------------------------

def test_sigterm_drains_running_requests_then_exits_zero(llama_target, llama_draft, expected):
    from bass.app.launcher import ServiceProcess
    from bass.core.config import WorkerServiceConfig
    from bass.target_service import server as target_server

    grace = 3.0
    target = target_server.serve(WorkerServiceConfig(model_dir=llama_target, num_slots=8, max_seq_len=512))
    _slow_verify(target.engine, 0.05)  # 20 steps/s: a 300-token request cannot finish in the grace period
    config = CoordinatorConfig(target_address=target.address, tokenizer_dir=llama_target, port=0,
                               shutdown_grace_s=grace, reconnect_interval_s=0.2,
                               scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse("0")))
    proc = ServiceProcess("coordinator", ["coordinator", "--config-json", json.dumps(asdict(config), default=str)])
    try:
        address = proc.wait_ready(120)
        with BassClient(address, timeout_s=60) as client:
            short = client.stream_raw(PROMPT, max_new_tokens=40, ignore_eos=True)
            long = client.stream_raw(PROMPT, max_new_tokens=300, ignore_eos=True)
            first_short, first_long = next(short), next(long)  # both are running
            proc.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            time.sleep(0.3)
            assert _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as refused:  # no new work once draining
                client.generate(PROMPT, max_new_tokens=4)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()

            rest = list(short)  # finishes within the grace period, correctly
            tokens = [t for m in [first_short] + rest for d in m.deltas for t in d.token_ids]
            assert tokens == expected and rest[-1].HasField("stats")
            with pytest.raises(grpc.RpcError) as cut:
                list(long)
            assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in cut.value.details()
            assert first_long.deltas
        code = proc.proc.wait(timeout=grace + 10)
        took = time.monotonic() - sent
        assert code == 0
        assert took <= grace + 1.0, f"exited {took:.2f} s after SIGTERM (grace {grace} s)"
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()
        target.stop(grace_s=0)


# -- 2. sizes -----------------------------------------------------------------------------------------

class CountingCodec:
    def __init__(self, codec):
        self.codec, self.encoded = codec, []

    def encode(self, text):
        self.encoded.append(len(text))
        return self.codec.encode(text)

    def decode(self, ids):
        return self.codec.decode(ids)


def test_oversized_requests_are_refused_before_any_work(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft, policy="3", max_seq_len=512)
    try:
        scheduler = s.coordinator.engine.scheduler
        counting = scheduler.codec = CountingCodec(scheduler.codec)
        max_token_bytes = s.coordinator.engine._max_token_bytes
        with BassClient(s.address, timeout_s=30) as client:
            def refused(prompt, **options) -> grpc.RpcError:
                t0 = time.monotonic()
                with pytest.raises(grpc.RpcError) as info:
                    client.generate(prompt, **options)
                assert time.monotonic() - t0 < 2.0
                return info.value

            # Over the public 4 MiB limit: refused by gRPC before it is even parsed.
            e = refused("x" * (5 << 20), max_new_tokens=4)
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Under it, but more bytes than max_seq_len tokens can hold: refused untokenized.
            e = refused("def f(x):\n" * 300_000, max_new_tokens=4)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("prompt:")
            limit = (512 - 16) * max_token_bytes
            e = refused("a" * (limit + 1), max_new_tokens=16)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("prompt:")
            assert counting.encoded == [], "an oversized prompt must not be tokenized"
            e = refused(list(range(1, 510)), max_new_tokens=4)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("prompt_token_ids:")
            e = refused(PROMPT, max_new_tokens=512)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("max_new_tokens:")

            # Stop strings: how many and how long.
            e = refused(PROMPT, max_new_tokens=4, stop=[f"s{i}" for i in range(17)])
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop:" in e.details() and "17" in e.details()
            e = refused(PROMPT, max_new_tokens=4, stop=["é" * 129])  # 258 bytes
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop:" in e.details() and "258" in e.details()

            # At the limits it is served.
            r = client.generate(PROMPT, max_new_tokens=4, stop=["z" * 256] * 16)
            assert len(r.sequences[0].token_ids) == 4
            # Just within the byte bound: tokenized, and the token count decides.
            with pytest.raises(grpc.RpcError) as info:
                client.generate("a" * limit, max_new_tokens=16)
            assert counting.encoded == [limit]
            assert info.value.details().startswith("max_new_tokens: prompt (")
            r = client.generate("def fibonacci(n):", max_new_tokens=16)
            assert counting.encoded[-1] == len("def fibonacci(n):") and len(r.sequences[0].token_ids) <= 16
    finally:
        s.stop()


def test_max_token_bytes_bounds_the_tokens_of_any_text(llama_target):
    """The byte check must never refuse a prompt that fits: no token decodes to more bytes."""
    from bass.coordinator.tokenizer import load_codec

    codec = load_codec(llama_target)
    texts = ["def fibonacci(n):\n" * 50, "é€𝄞 mixed ünïcödé " * 40, " " * 997, "\n\n\n\t\t" * 100]
    for text in texts:
        assert len(text.encode()) <= len(codec.encode(text)) * codec.max_token_bytes


# -- 3. sampling extremes -------------------------------------------------------------------------------

def test_sampling_params_tiny_temperatures_are_greedy_and_bad_values_named():
    for t in (5e-324, 1e-45, 1e-38, 1e-37, GREEDY_TEMPERATURE * 0.999):
        assert SamplingParams(temperature=t).greedy and SamplingParams(temperature=t).temperature == 0.0
    assert not SamplingParams(temperature=GREEDY_TEMPERATURE).greedy
    bad = [dict(temperature=-1e-45), dict(temperature=math.nan), dict(temperature=math.inf),
           dict(top_p=0.0), dict(top_p=-0.5), dict(top_p=1.0000001), dict(top_p=math.nan), dict(top_k=-1)]
    for params in bad:
        with pytest.raises(InvalidRequestError) as info:
            SamplingParams(**params)
        assert info.value.field == next(iter(params))


ACCEPTED_EXTREMES = [
    SamplingParams(temperature=t, top_k=k, top_p=p)
    for t in (GREEDY_TEMPERATURE, 1e-3, 1.0, 1e30, 3.4028234e38)
    for k in (0, 1, 2, 299, 300, 301, 2**32 - 1)
    for p in (1e-45, 1e-38, 0.5, 1.0)
] + [SamplingParams(temperature=1e-38), SamplingParams(temperature=0.0, top_k=1, top_p=1e-45)]


def test_no_accepted_sampling_value_gives_nan_or_inf_probabilities():
    """Every combination of extreme values that validation lets through, over logits with large
    magnitudes and ties, in every dtype a model may produce: probabilities stay finite."""
    from bass.engine.sampling import RowParams, compact_shaped, shape_probs

    g = torch.Generator().manual_seed(0)
    vocab = 300
    rows = [torch.randn(vocab, generator=g) * 30, torch.zeros(vocab), torch.full((vocab,), 1e4),
            torch.linspace(-6e4, 6e4, vocab)]
    logits = torch.stack(rows)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = logits.to(dtype)
        for params in ACCEPTED_EXTREMES:
            rp = RowParams.build([params] * len(rows), "cpu")
            probs = shape_probs(x, rp)
            assert torch.isfinite(probs).all(), (params, dtype)
            assert (probs >= 0).all() and torch.allclose(probs.sum(-1), torch.ones(len(rows)), atol=1e-4), params
            ids, q = compact_shaped(x, rp, 64)
            assert torch.isfinite(q).all() and (ids >= 0).all() and (ids < vocab).all(), (params, dtype)


def test_extreme_sampling_values_end_to_end(llama_target, llama_draft, expected):
    s = start_services(llama_target, llama_draft, policy="3")
    try:
        with BassClient(s.address, timeout_s=60) as client:
            for t in (1e-45, 1e-38, 1e-37):  # was: the last vocabulary id repeated
                r = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True, temperature=t, seed=1)
                assert list(r.sequences[0].token_ids) == expected, t
            # A top_p so small it keeps only the most likely token is greedy too, whatever top_k.
            r = client.generate(PROMPT, max_new_tokens=40, ignore_eos=True, temperature=1.0, top_p=1e-45,
                                top_k=2**32 - 1, seed=3)
            assert list(r.sequences[0].token_ids) == expected
            for options in (dict(temperature=3.4028234e38, top_k=1), dict(temperature=3.4028234e38, top_p=1e-38),
                            dict(temperature=1e30), dict(temperature=GREEDY_TEMPERATURE, top_k=299)):
                r = client.generate(PROMPT, n=2, max_new_tokens=24, ignore_eos=True, seed=5, **options)
                for seq in r.sequences:
                    assert len(seq.token_ids) == 24 and all(0 <= t < 300 for t in seq.token_ids), options
            for field, value in (("temperature", -1e-45), ("temperature", math.inf), ("top_p", -1.0),
                                 ("top_p", 1.5), ("temperature", math.nan)):
                with pytest.raises(grpc.RpcError) as info:
                    client.generate(PROMPT, max_new_tokens=4, **{field: value})
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details().startswith(field), info.value.details()
    finally:
        s.stop()


# -- 4. reconnects -----------------------------------------------------------------------------------

def test_reconnects_within_the_interval_whatever_the_outage(llama_target, llama_draft, expected):
    interval, outage = 0.5, 6.0  # gRPC's backoff after 6 s of failures is several seconds
    # The interval plus one probe and one short request; the slack is for a 2-core CI machine
    # busy with the rest of the suite (1.52 and 2.03 s seen there against 1.0 s alone). gRPC's
    # own backoff after this outage waits several seconds (about 4 s at its 4th attempt, +-20%),
    # which this bound still tells apart.
    bound = interval + 2.25
    s = start_services(llama_target, llama_draft, policy="3", reconnect_interval_s=interval)
    try:
        with BassClient(s.address, timeout_s=30) as client:
            def ask():
                return client.generate(PROMPT, max_new_tokens=8, ignore_eos=True)

            assert ask().stats.draft_tokens > 0
            # The draft: gone for `outage` while requests keep coming (each probes it once due).
            s.draft.stop(grace_s=0)
            end = time.monotonic() + outage
            while time.monotonic() < end:
                assert ask().stats.draft_tokens == 0
                time.sleep(0.1)
            s.restart_draft()
            back = time.monotonic()
            while ask().stats.draft_tokens == 0:
                assert time.monotonic() - back < 20
                time.sleep(0.02)
            draft_took = time.monotonic() - back

            # The target: gone for `outage`; every request meanwhile is refused at once.
            s.target.stop(grace_s=0)
            end = time.monotonic() + outage
            while time.monotonic() < end:
                with pytest.raises(grpc.RpcError) as info:
                    ask()
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                time.sleep(0.2)
            s.restart_target()
            back = time.monotonic()
            while True:
                try:
                    r = ask()
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - back < 60
                    time.sleep(0.02)
            target_took = time.monotonic() - back
            assert list(r.sequences[0].token_ids) == expected[:8]
        assert draft_took <= bound, f"draft re-attached {draft_took:.2f} s after it served"
        assert target_took <= bound, f"target served again {target_took:.2f} s after it was back"
    finally:
        s.stop()


# -- 5. the queue limit ---------------------------------------------------------------------------------

def test_queue_limit_is_hard_under_a_burst(llama_target, llama_draft, expected):
    max_waiting, batch, burst = 8, 2, 80
    s = start_services(llama_target, llama_draft, policy="0", max_batch_size=batch, num_slots=batch,
                       max_waiting=max_waiting, metrics_port=0)
    engine = s.coordinator.engine
    _slow_verify(s.target.engine, 0.02)
    peak = {"waiting": 0, "queued": 0, "gauge": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            scheduler = engine.scheduler
            peak["waiting"] = max(peak["waiting"], len(scheduler.waiting) if scheduler else 0)
            peak["queued"] = max(peak["queued"], engine.queued)
            gauge = engine.metrics.registry.get_sample_value("bass_waiting_requests") or 0.0
            peak["gauge"] = max(peak["gauge"], gauge)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with grpc.insecure_channel(s.address) as channel:
            from bass.v1 import generation_pb2_grpc
            stub = generation_pb2_grpc.GenerationStub(channel)
            request = build_request(PROMPT, max_new_tokens=12, ignore_eos=True)
            # Fill the batch with long requests first: every request of the burst must queue.
            fillers = [stub.GenerateStream(build_request(PROMPT, max_new_tokens=100, ignore_eos=True), timeout=120)
                       for _ in range(batch)]
            for f in fillers:
                next(f)
            t0 = time.monotonic()
            answered = {}
            calls = [stub.Generate.future(request, timeout=120) for _ in range(burst)]
            for i, call in enumerate(calls):
                call.add_done_callback(lambda _, i=i: answered.setdefault(i, time.monotonic() - t0))
            refused, ok = [], []
            for i, call in enumerate(calls):
                try:
                    ok.append((list(call.result().sequences[0].token_ids), answered[i]))
                except grpc.RpcError as e:
                    refused.append((e.code(), e.details(), answered[i]))
            for f in fillers:  # they finish normally
                assert list(f)[-1].HasField("stats")
    finally:
        done.set()
        watcher.join()
        s.stop()
    assert len(ok) + len(refused) == burst
    assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED for code, _, _ in refused), refused[:3]
    assert all(tokens == expected[:12] for tokens, _ in ok)
    assert peak["queued"] <= max_waiting and peak["waiting"] <= max_waiting and peak["gauge"] <= max_waiting, peak
    # The fillers hold the batch for >= 100 x 20 ms, far longer than the burst takes to arrive:
    # exactly the queue's places were taken, and the rest refused at once.
    assert len(ok) == max_waiting, len(ok)
    assert max(t for _, _, t in refused) < 2.0


# -- 6. smaller ----------------------------------------------------------------------------------------

def test_undecodable_requests_are_invalid_argument_with_one_log_line(llama_target, llama_draft, caplog):
    s = start_services(llama_target, llama_draft, policy="3")
    try:
        with caplog.at_level(logging.INFO), grpc.insecure_channel(s.address) as channel:
            raw = channel.unary_unary("/bass.v1.Generation/Generate")
            raw_stream = channel.unary_stream("/bass.v1.Generation/GenerateStream")
            for i in range(40):
                garbage = bytes([0xFF, 0xFF, 0xFF, i])  # not a protobuf message
                with pytest.raises(grpc.RpcError) as info:
                    raw(garbage, timeout=5) if i % 2 else list(raw_stream(garbage, timeout=5))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details().startswith("request: cannot be decoded")
            with BassClient(s.address) as client:  # the server is fine
                assert client.generate(PROMPT, max_new_tokens=4).sequences[0].token_ids
    finally:
        s.stop()
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()
             or "deserializ" in r.getMessage().lower()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, [r.getMessage() for r in lines]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_draft_available_gauge_is_right_before_any_request(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft, policy="3", metrics_port=0)
    try:
        registry = s.coordinator.engine.metrics.registry
        time.sleep(0.3)  # the idle loop has run
        assert registry.get_sample_value("bass_draft_available") == 1.0
        assert registry.get_sample_value("bass_target_available") == 1.0
        # Idle: the draft dies and comes back with no request in between; the gauge follows
        # within the interval (0.2 s) plus a probe and a turn of the idle loop (0.5 s). Coming
        # back also waits out gRPC's reconnect backoff after the probes that were refused: 1 s,
        # then 1.6 s, +-20% (a fresh clone's CI run on 2 cores missed a 1.5 s bound once).
        s.draft.stop(grace_s=0)
        assert _gauge_becomes(registry, "bass_draft_available", 0.0, within_s=1.5)
        s.restart_draft()
        assert _gauge_becomes(registry, "bass_draft_available", 1.0, within_s=4.0)
        s.draft.stop(grace_s=0)
        with BassClient(s.address) as client:
            client.generate(PROMPT, max_new_tokens=4)
        time.sleep(0.3)
        assert registry.get_sample_value("bass_draft_available") == 0.0
    finally:
        s.stop()


def _gauge_becomes(registry, name: str, value: float, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if registry.get_sample_value(name) == value:
            return True
        time.sleep(0.02)
    return False


def test_generate_defaults_to_auto_device_like_serve(monkeypatch, llama_target):
    """With a GPU present, `bass generate` uses it in bf16, as `bass serve` does."""
    from click.testing import CliRunner

    import bass.app.local
    from bass.cli import main

    seen = {}

    def fake_build(target, draft, **_):
        seen["device"], seen["dtype"] = target.device, target.dtype
        raise InvalidRequestError("model", "stop here")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bass.app.local, "build_local_scheduler", fake_build)
    result = CliRunner().invoke(main, ["generate", "--target", str(llama_target), "--prompt-ids", "5,17"])
    assert "stop here" in result.output
    assert seen == {"device": "cuda", "dtype": "bfloat16"}
