"""The router in front of several replicas (coordinator/router.py, coordinator/replicas.py).

Most tests put it in front of stand-in replicas: small gRPC servers that speak
bass.v1.Generation and bass.v1.Replica, whose load, answers and failures each test sets, so
that routing by load, retries and rejoins can be checked exactly. The last one puts it in front
of real coordinators over tiny models (in this process); tests/test_serve_replicas.py runs
`bass serve --replicas` as processes, tests/test_ray_deploy.py `bass up` with replicas.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bass.app.client import BassClient, build_request
from bass.coordinator import router as router_module
from bass.core.config import RouterConfig
from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc
from test_metrics import scrape

POLL_S = 0.05


class FakeReplica(generation_pb2_grpc.GenerationServicer, generation_pb2_grpc.ReplicaServicer):
    """A stand-in replica: answers every request with its name as the text of n sequences and
    records what it got (requests, deadlines, invocation metadata); `load`, `serving`, `hold`
    (block each call until released), `fail` (UNAVAILABLE before answering), `full`
    (RESOURCE_EXHAUSTED before answering, as a coordinator at max_waiting) and `cut_after` (a
    stream fails after that many messages) are set by the test. Every call's trailing metadata
    names the replica (x-served-by), and an answer's initial metadata too (x-replica)."""

    def __init__(self, name: str, port: int = 0, kv_slots: int = 8):
        self.name, self.kv_slots = name, kv_slots
        self.running = self.queued = 0
        self.serving = True
        self.max_n = 16
        self.load_delay_s = 0.0  # answer Load this late (past the probe timeout: as if gone)
        self.fail = False
        self.full = False
        self.invalid = False  # INVALID_ARGUMENT as for the prompt "invalid", once `hold` lets it go
        self.cut_after: int | None = None
        self.hold = threading.Event()
        self.hold.set()
        self.received: list[pb.GenerateRequest] = []
        self.cancelled = threading.Event()
        self.deadlines: list[float | None] = []
        self.metadata: list[tuple] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(16))
        generation_pb2_grpc.add_GenerationServicer_to_server(self, self.server)
        generation_pb2_grpc.add_ReplicaServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(0).wait()

    def Load(self, request, context):
        time.sleep(self.load_delay_s)
        with self.lock:
            return pb.LoadResponse(serving=self.serving, running_sequences=self.running,
                                   queued_sequences=self.queued, kv_slots=self.kv_slots, max_batch_size=64,
                                   max_waiting=16, max_n=self.max_n)

    def _enter(self, request, context):
        with self.lock:
            self.received.append(request)
            self.deadlines.append(context.time_remaining())
            self.metadata.append(tuple(context.invocation_metadata()))
        context.add_callback(self.cancelled.set)
        context.set_trailing_metadata((("x-served-by", self.name),))
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name}: target down")
        if self.full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: the queue is full (16 requests waiting); "
                                                              "retry later")
        if request.prompt == "invalid":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "temperature: must be a finite number >= 0")
        self.hold.wait(30)
        if self.invalid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "temperature: must be a finite number >= 0")
        context.send_initial_metadata((("x-replica", self.name),))

    def Generate(self, request, context):
        self._enter(request, context)
        return pb.GenerateResponse(sequences=[pb.Sequence(index=request.first_index + i, text=self.name)
                                             for i in range(request.n or 1)])

    def GenerateStream(self, request, context):
        self._enter(request, context)
        for i in range(3):
            if self.cut_after is not None and i == self.cut_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name}: target failed")
            yield pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(index=request.first_index, text=f"{self.name}{i}")])
            time.sleep(0.01)
        yield pb.GenerateStreamResponse(stats=pb.Stats(steps=3))


def fake_replicas():
    """Two stand-in replicas, a and b, stopped when the generator is closed."""
    made = [FakeReplica("a"), FakeReplica("b")]
    yield made
    for r in made:
        r.stop()


@pytest.fixture
def replicas():
    yield from fake_replicas()


def start_router(replicas, **options):
    config = RouterConfig(**{"replicas": tuple(r.address for r in replicas), "port": 0, "metrics_port": 0,
                             "poll_interval_s": POLL_S, "probe_timeout_s": 0.3, **options})
    return router_module.serve(config)


@pytest.fixture
def router(replicas):
    """Requests go whole here (split_min_sequences = 0): how they are routed and retried is what
    these tests check; tests/test_router_split.py checks requests split over the replicas."""
    r = start_router(replicas, split_min_sequences=0)
    yield r
    r.stop(0)


def who(address, prompt="p", **kw) -> str:
    with BassClient(address, timeout_s=10) as c:
        reply = c.generate(prompt, **kw)
    assert len({s.text for s in reply.sequences}) == 1
    return reply.sequences[0].text


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_each_request_goes_to_the_least_loaded_replica(replicas, router):
    a, b = replicas
    a.running = 6
    time.sleep(3 * POLL_S)
    assert [who(router.address) for _ in range(4)] == ["b"] * 4
    a.running, b.running, b.queued = 0, 4, 3
    time.sleep(3 * POLL_S)
    assert [who(router.address) for _ in range(4)] == ["a"] * 4


def test_equal_replicas_share_a_burst_by_what_is_in_flight(replicas, router):
    """Between polls the router counts what it forwarded: 6 concurrent requests of 2 sequences
    to two idle replicas go 3 and 3, not all to whichever looked idle."""
    for r in replicas:
        r.hold.clear()
    with futures.ThreadPoolExecutor(6) as pool:
        results = [pool.submit(who, router.address, n=2) for _ in range(6)]
        wait_until(lambda: sum(len(r.received) for r in replicas) == 6)
        for r in replicas:
            r.hold.set()
        names = sorted(f.result() for f in results)
    assert names == ["a"] * 3 + ["b"] * 3


def test_without_splitting_all_sequences_of_a_request_go_to_one_replica_untouched(replicas, router):
    request = build_request("def f(x):", n=5, max_new_tokens=7, temperature=0.8, seed=3, stop=["\n"])
    with BassClient(router.address) as c:
        reply = c.stub.Generate(request, timeout=10)
    assert len(reply.sequences) == 5 and len({s.text for s in reply.sequences}) == 1
    got = [m for r in replicas for m in r.received]
    assert got == [request]  # one replica got it, byte for byte the same request


def test_streams_pass_through_and_statuses_keep_their_code_and_message(replicas, router):
    with BassClient(router.address) as c:
        messages = list(c.stream_raw("p"))
        assert [d.text for m in messages for d in m.deltas][1:] == [messages[0].deltas[0].text[0] + "1",
                                                                     messages[0].deltas[0].text[0] + "2"]
        assert messages[-1].stats.steps == 3
        with pytest.raises(grpc.RpcError) as info:
            c.generate("invalid")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "temperature: must be a finite number >= 0"
    # The request's fault: asked once, not again elsewhere; the replica's trailing metadata comes along.
    assert sum(m.prompt == "invalid" for r in replicas for m in r.received) == 1
    assert ("x-served-by", [r.name for r in replicas if any(m.prompt == "invalid" for m in r.received)][0]) \
        in tuple(info.value.trailing_metadata())


def test_a_deadline_travels_and_a_cancel_reaches_the_replica(replicas, router):
    a, b = replicas
    b.serving = False
    time.sleep(3 * POLL_S)
    a.hold.clear()
    with BassClient(router.address, timeout_s=2.0) as c:
        stream = c.stub.GenerateStream(build_request("p"), timeout=2.0)
        wait_until(lambda: a.received)
        stream.cancel()
    assert a.cancelled.wait(5), "the replica's call was not cancelled"
    assert 1.0 < a.deadlines[0] <= 2.1  # the client's 2 s (gRPC rounds a timeout up on the wire)
    a.hold.set()


def test_a_replica_that_fails_before_answering_is_retried_elsewhere(replicas, router):
    a, b = replicas
    b.running = 5  # a looks better, but fails
    time.sleep(3 * POLL_S)
    a.fail = True
    assert who(router.address) == "b"
    with BassClient(router.address) as c:  # a stream that failed before its first message too
        assert list(c.stream_raw("p"))[0].deltas[0].text == "b0"
    metrics = scrape(router.metrics_server.address)
    assert metrics[("bass_router_retries_total", (("replica", a.address),))] >= 1


def test_a_stream_cut_after_its_first_message_fails_unavailable(replicas, router):
    a, b = replicas
    b.serving = False
    time.sleep(3 * POLL_S)
    a.cut_after = 1
    got = []
    with BassClient(router.address) as c, pytest.raises(grpc.RpcError) as info:
        for m in c.stream_raw("p"):
            got.append(m)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "a: target failed" in info.value.details()
    assert len(got) == 1 and len(a.received) == 1  # not sent again: the client already has tokens


def test_a_full_replica_sends_the_request_elsewhere_and_is_avoided_until_its_next_poll(replicas):
    """a looks better but its queue is full (RESOURCE_EXHAUSTED): the request goes to b, the
    client sees only b's answer, and the next requests skip a though it has room again, until a
    poll of a (called here: the router polls every 30 s in this test) says so."""
    a, b = replicas
    b.running = 5
    a.full = True
    router = start_router(replicas, poll_interval_s=30.0)
    try:
        assert who(router.address) == "b"
        assert len(a.received) == 1 and len(b.received) == 1
        with BassClient(router.address) as c:  # a stream: a is not asked again, nothing of a's streamed
            stream = c.stream_raw("p")
            messages = list(stream)
            assert [d.text for m in messages for d in m.deltas] == ["b0", "b1", "b2"]
            assert ("x-replica", "b") in stream.initial_metadata()
            assert ("x-served-by", "b") in stream.trailing_metadata()  # b's trailers, not a's refusal's
        a.full = False
        assert [who(router.address) for _ in range(3)] == ["b"] * 3
        assert len(a.received) == 1
        metrics = scrape(router.metrics_server.address)
        assert metrics[("bass_router_requests_total", (("code", "resource_exhausted"), ("replica", a.address)))] == 1
        assert metrics[("bass_router_retries_total", (("replica", a.address),))] == 1
        router.replicas.replicas[a.address].poll()  # a poll finds room: a is a candidate as before
        assert who(router.address) == "a"
    finally:
        router.stop(0)


def test_a_full_stream_is_retried_before_its_first_message(replicas, router):
    a, b = replicas
    b.running = 5
    time.sleep(3 * POLL_S)
    a.full = True
    with BassClient(router.address) as c:
        got = [d.text for m in c.stream_raw("p") for d in m.deltas]
    assert got == ["b0", "b1", "b2"] and len(a.received) == 1 and len(b.received) == 1


def test_all_replicas_full_is_resource_exhausted_saying_so(replicas):
    a, b = replicas
    a.full = b.full = True
    router = start_router(replicas, max_retries=5)
    try:
        for call in ("generate", "stream"):
            with BassClient(router.address) as c, pytest.raises(grpc.RpcError) as info:
                if call == "generate":
                    c.generate("p")
                else:
                    assert list(c.stream_raw("p")) == []
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = info.value.details()
            assert details.startswith("every replica tried is full (2 of 2 known); retry later")
            assert f"replica {a.address} is full: a: the queue is full" in details
            assert f"replica {b.address} is full: b: the queue is full" in details
        # Each asked once a request, never twice, though max_retries would allow it.
        assert len(a.received) == 2 and len(b.received) == 2
    finally:
        router.stop(0)


def test_a_full_replica_and_a_failing_one_is_unavailable(replicas):
    """Only when every replica tried said its queue was full is the answer RESOURCE_EXHAUSTED."""
    a, b = replicas
    a.full, b.fail = True, True
    router = start_router(replicas)
    try:
        with pytest.raises(grpc.RpcError) as info:
            who(router.address)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "is full: a: the queue is full" in info.value.details()
        assert "failed: b: target down" in info.value.details()
    finally:
        router.stop(0)


def test_a_message_over_a_size_limit_is_not_retried(replicas):
    """gRPC's own RESOURCE_EXHAUSTED for a message too large is the message's, not a full queue:
    passed on at once, and the replica is not marked full. (A replica that takes smaller
    messages than the router: its server refuses the request.)"""
    small = FakeReplica("small")
    small.server.stop(0).wait()
    small.server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 2048)])
    generation_pb2_grpc.add_GenerationServicer_to_server(small, small.server)
    generation_pb2_grpc.add_ReplicaServicer_to_server(small, small.server)
    small.port = small.server.add_insecure_port("127.0.0.1:0")
    small.server.start()
    router = start_router([small, replicas[1]])
    try:
        replicas[1].running = 7  # small looks better
        time.sleep(3 * POLL_S)
        with pytest.raises(grpc.RpcError) as info:
            who(router.address, prompt="x" * 4000)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in info.value.details()
        assert replicas[1].received == [] and not router.replicas.replicas[small.address].full
    finally:
        router.stop(0)
        small.stop()


def test_the_clients_metadata_reaches_the_replica_and_the_replicas_comes_back(replicas, router):
    """Custom keys (text and -bin) travel both ways; hop keys the client sends (grpc-..., host,
    connection) are not forwarded and do not break the call; the deadline still does."""
    a, b = replicas
    b.serving = False
    time.sleep(3 * POLL_S)
    sent = (("x-request-id", "req-42"), ("x-tenant", "t1"), ("trace-bin", b"\x00\xff\x01"),
            ("grpc-custom", "hop"), ("host", "elsewhere"), ("connection", "close"))
    with BassClient(router.address) as c:
        reply, call = c.stub.Generate.with_call(build_request("p"), metadata=sent, timeout=5)
        assert reply.sequences[0].text == "a"
        assert ("x-replica", "a") in call.initial_metadata()
        assert ("x-served-by", "a") in call.trailing_metadata()
        stream = c.stub.GenerateStream(build_request("p"), metadata=sent, timeout=5)
        assert len(list(stream)) == 4
    for got in a.metadata:
        keys = dict(got)
        assert keys["x-request-id"] == "req-42" and keys["x-tenant"] == "t1" and keys["trace-bin"] == b"\x00\xff\x01"
        assert not {"grpc-custom", "host", "connection"} & set(keys)
        assert keys["user-agent"].startswith("grpc-python-asyncio")  # the router's own, not the client's
    assert len(a.metadata) == 2 and all(d is not None and 3.0 < d <= 5.1 for d in a.deadlines)


def test_a_killed_replica_loses_traffic_within_a_second_and_rejoins(replicas, router):
    a, b = replicas
    assert {who(router.address) for _ in range(6)} == {"a", "b"}
    port = a.port
    a.stop()
    killed = time.monotonic()
    wait_until(lambda: all(who(router.address) == "b" for _ in range(3)), timeout_s=1.0)
    assert time.monotonic() - killed < 1.0
    metrics = scrape(router.metrics_server.address)
    assert metrics[("bass_replica_up", (("replica", a.address),))] == 0
    assert metrics[("bass_replica_up", (("replica", b.address),))] == 1
    # Back on its address: it takes requests again, with no restart of the router.
    replicas[0] = FakeReplica("a2", port=port)
    back = time.monotonic()
    wait_until(lambda: "a2" in {who(router.address) for _ in range(4)}, timeout_s=3.0)
    assert time.monotonic() - back < 2.5


def test_no_replica_serving_is_unavailable_and_not_serving_health(replicas, router):
    for r in replicas:
        r.serving = False
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(router.address))
    wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(service="bass.v1.Generation"), timeout=2).status
               == health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(grpc.RpcError) as info:
        who(router.address)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "no replica is serving (2 known)" in info.value.details()
    replicas[1].serving = True
    wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(service="bass.v1.Generation"), timeout=2).status
               == health_pb2.HealthCheckResponse.SERVING)
    assert who(router.address) == "b"


def test_metrics_show_each_replicas_load(replicas, router):
    a, b = replicas
    a.running, a.queued, b.kv_slots = 3, 2, 16
    # Until a poll has seen the new loads (a fixed sleep of a few polls flaked on a busy CI host).
    seen = {("bass_replica_running_sequences", (("replica", a.address),)): 3,
            ("bass_replica_queued_sequences", (("replica", a.address),)): 2,
            ("bass_replica_kv_slots", (("replica", b.address),)): 16}
    wait_until(lambda: all(scrape(router.metrics_server.address).get(k) == v for k, v in seen.items()))
    who(router.address)
    m = scrape(router.metrics_server.address)
    assert m[("bass_replica_running_sequences", (("replica", a.address),))] == 3
    assert m[("bass_replica_queued_sequences", (("replica", a.address),))] == 2
    assert m[("bass_replica_kv_slots", (("replica", b.address),))] == 16
    assert m[("bass_router_requests_total", (("code", "ok"), ("replica", b.address)))] == 1


def test_a_replica_that_stops_answering_is_lost_and_its_calls_end_unavailable():
    """A node lost sends no reset: the replica's polls time out, and after lost_after_s its
    calls in flight are cancelled and answered UNAVAILABLE (here: the stand-in stops answering
    its polls while a stream hangs in it)."""
    a = FakeReplica("a")
    try:
        router = start_router([a], lost_after_s=0.5, max_retries=0)
        a.hold.clear()
        with BassClient(router.address) as c:
            stream = c.stub.GenerateStream(build_request("p"), timeout=8)
            wait_until(lambda: a.received)
            a.load_delay_s = 1.0  # past probe_timeout_s
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                list(stream)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 3.0
        router.stop(0)
    finally:
        a.hold.set()
        a.stop()


def test_dns_discovery_finds_the_replicas_behind_a_name(replicas):
    """replica_dns: every address the name resolves to is a replica (here localhost: one)."""
    a, _ = replicas
    router = router_module.serve(RouterConfig(replica_dns=f"localhost:{a.port}", port=0, poll_interval_s=POLL_S,
                                              discovery_interval_s=0.2))
    try:
        assert set(router.replicas.replicas) <= {a.address, f"[::1]:{a.port}"} and a.address in router.replicas.replicas
        assert who(router.address) == "a"
    finally:
        router.stop(0)


def test_config_is_checked():
    from bass.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="router.replicas"):
        RouterConfig(replicas=("nohost",))
    with pytest.raises(InvalidRequestError, match="router.poll_interval_s"):
        RouterConfig(poll_interval_s=0)
    with pytest.raises(InvalidRequestError, match="router.replicas"):
        router_module.serve(RouterConfig(port=0))


# -- in front of real coordinators (tiny models, in this process) ---------------------------------
@pytest.fixture(scope="module")
def real(llama_target, llama_draft):
    from services import start_services

    stacks = [start_services(llama_target, llama_draft, colocate=True, num_slots=8, max_batch_size=8,
                             policy="fixed") for _ in range(2)]
    router = router_module.serve(RouterConfig(replicas=tuple(s.address for s in stacks), port=0,
                                              poll_interval_s=POLL_S))
    yield router, stacks
    router.stop(0)
    for s in stacks:
        s.stop()


def replica_load(address: str) -> pb.LoadResponse:
    with grpc.insecure_channel(address) as channel:
        return generation_pb2_grpc.ReplicaStub(channel).Load(pb.LoadRequest(), timeout=5)


def test_real_replicas_report_their_load_and_a_cancel_frees_the_slots(real):
    router, stacks = real
    idle = [replica_load(s.address) for s in stacks]
    assert all(x.serving and x.kv_slots == 8 and x.running_sequences == 0 and x.max_batch_size == 8 for x in idle)
    with BassClient(stacks[0].address, timeout_s=60) as direct:
        want = [list(s.token_ids) for s in direct.generate([5, 17, 33], n=2, max_new_tokens=10, ignore_eos=True).sequences]
    with BassClient(router.address, timeout_s=60) as c:
        got = [list(s.token_ids) for s in c.generate([5, 17, 33], n=2, max_new_tokens=10, ignore_eos=True).sequences]
        assert got == want  # greedy: the same text whichever replica ran it
        stream = c.stub.GenerateStream(build_request([5, 17, 33], n=3, max_new_tokens=400, ignore_eos=True), timeout=60)
        next(stream)
        # Split over the two idle replicas (router.split_min_sequences): 2 and 1 sequences.
        wait_until(lambda: sorted(replica_load(s.address).running_sequences for s in stacks) == [1, 2])
        stream.cancel()
        wait_until(lambda: all(replica_load(s.address).running_sequences == 0 for s in stacks))


def test_a_real_coordinators_full_queue_sends_the_request_to_the_other(llama_target, llama_draft):
    """Real coordinators that hold one running and one waiting request (max_batch_size 1,
    max_waiting 1). Replica a is filled by clients of its own, behind the router's back (it
    polls every 30 s here, so it still believes a idle): the router's requests that try a get
    its RESOURCE_EXHAUSTED and go to b, whose text they return, and a is tried only once."""
    from services import start_services

    stacks = [start_services(llama_target, llama_draft, colocate=True, num_slots=4, max_batch_size=1, max_waiting=1,
                             policy="fixed") for _ in range(2)]
    a, b = stacks
    router = router_module.serve(RouterConfig(replicas=(a.address, b.address), port=0, metrics_port=0,
                                              poll_interval_s=30.0))
    fillers = []
    try:
        with BassClient(b.address, timeout_s=60) as direct:
            want = list(direct.generate([5, 17, 33], max_new_tokens=8, ignore_eos=True).sequences[0].token_ids)
        with BassClient(a.address, timeout_s=120) as direct:
            for _ in range(2):  # one runs, then one waits: a's queue is full
                fillers.append(direct.stub.GenerateStream(
                    build_request([9, 8, 7], max_new_tokens=400, ignore_eos=True), timeout=120))
                if len(fillers) == 1:
                    next(fillers[0])
            wait_until(lambda: (replica_load(a.address).running_sequences, replica_load(a.address).queued_requests)
                       == (1, 1), timeout_s=30)
            with BassClient(router.address, timeout_s=60) as c:
                got = [list(c.generate([5, 17, 33], max_new_tokens=8, ignore_eos=True).sequences[0].token_ids)
                       for _ in range(2)]
            assert got == [want, want]
            metrics = scrape(router.metrics_server.address)
            assert metrics[("bass_router_requests_total", (("code", "resource_exhausted"), ("replica", a.address)))] == 1
            assert metrics[("bass_router_requests_total", (("code", "ok"), ("replica", b.address)))] == 2
            for stream in fillers:
                stream.cancel()
    finally:
        router.stop(0)
        for s in stacks:
            s.stop()
