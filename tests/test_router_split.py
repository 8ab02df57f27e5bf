"""A request's sequences split over several replicas by the router (coordinator/request_split.py,
router.split_min_sequences): the parts, the merged answers, and the parts' failures; first in
front of stand-in replicas (tests/test_router.py's), then of real coordinators over tiny models,
where the split request must sample exactly the sequences of the whole one."""

from __future__ import annotations

import math
import time
from concurrent import futures

import grpc
import pytest

from bass.app.client import BassClient, build_request
from bass.coordinator import router as router_module
from bass.coordinator.request_split import StreamMerge, merge_answers, part_sizes, split_request
from bass.core.config import RouterConfig
from bass.core.errors import InvalidRequestError
from bass.v1 import generation_pb2 as pb
from test_metrics import scrape
from test_router import POLL_S, fake_replicas, start_router, wait_until


# -- the parts and the merge ------------------------------------------------------------------------
def test_parts_are_contiguous_ranges_of_the_request_otherwise_unchanged():
    assert part_sizes(7, 3) == [3, 2, 2] and part_sizes(2, 2) == [1, 1] and part_sizes(8, 4) == [2, 2, 2, 2]
    request = build_request("def f(x):", n=7, max_new_tokens=9, temperature=0.8, top_p=0.9, seed=5, stop=["\n"])
    request.first_index = 2
    parts = split_request(request, 3)
    assert [(p.first_index, p.n) for p in parts] == [(2, 3), (5, 2), (7, 2)]
    for part in parts:
        got = pb.GenerateRequest.FromString(part.raw)
        assert (got.first_index, got.n) == (part.first_index, part.n)
        got.first_index, got.n = request.first_index, request.n
        assert got == request


def test_merged_answers_are_in_index_order_with_one_finish_order_and_summed_stats():
    first = pb.GenerateResponse(
        sequences=[pb.Sequence(index=0, text="a0", finish_order=2, finish_ms=30.0),
                   pb.Sequence(index=1, text="a1", finish_order=1, finish_ms=10.0)],
        stats=pb.Stats(steps=12, draft_tokens=40, accepted_tokens=30, generated_tokens=50, time_ms=31, queue_ms=1))
    second = pb.GenerateResponse(
        sequences=[pb.Sequence(index=3, text="b3", finish_order=0),  # did not finish (time budget)
                   pb.Sequence(index=2, text="b2", finish_order=1, finish_ms=20.0)],
        stats=pb.Stats(steps=9, draft_tokens=20, accepted_tokens=20, generated_tokens=22, time_ms=25, queue_ms=4))
    merged = merge_answers([second, first])
    assert [(s.index, s.text, s.finish_order) for s in merged.sequences] == \
        [(0, "a0", 3), (1, "a1", 1), (2, "b2", 2), (3, "b3", 0)]
    st = merged.stats
    assert (st.steps, st.draft_tokens, st.accepted_tokens, st.generated_tokens, st.time_ms, st.queue_ms) == \
        (12, 60, 50, 72, 31, 4)
    assert st.acceptance_rate == pytest.approx(50 / 60)
    nothing_drafted = merge_answers([pb.GenerateResponse(stats=pb.Stats(steps=3))])
    assert math.isnan(nothing_drafted.stats.acceptance_rate)


def test_a_merged_stream_passes_deltas_and_closes_with_the_parts_stats_merged():
    merge = StreamMerge()
    delta = pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(index=3, token_ids=[5], text="x")]).SerializeToString()
    assert merge.pass_on(delta) == delta  # passed as it came
    assert merge.pass_on(pb.GenerateStreamResponse(stats=pb.Stats(steps=4, generated_tokens=8)).SerializeToString()) \
        is None
    both = pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(index=0, token_ids=[7])],
                                     stats=pb.Stats(steps=6, generated_tokens=5))
    passed = pb.GenerateStreamResponse.FromString(merge.pass_on(both.SerializeToString()))
    assert list(passed.deltas) == list(both.deltas) and not passed.HasField("stats")
    closing = pb.GenerateStreamResponse.FromString(merge.closing())
    assert not closing.deltas and (closing.stats.steps, closing.stats.generated_tokens) == (6, 13)


def test_the_split_threshold_is_checked():
    with pytest.raises(InvalidRequestError, match="router.split_min_sequences"):
        RouterConfig(split_min_sequences=1)
    with pytest.raises(InvalidRequestError, match="first_index"):
        from bass.coordinator.requests import GenerationRequest
        GenerationRequest(prompt="p", n=2, first_index=(1 << 32) - 2)


# -- in front of stand-in replicas --------------------------------------------------------------------
@pytest.fixture
def replicas():
    yield from fake_replicas()


@pytest.fixture
def router(replicas):
    r = start_router(replicas)
    yield r
    r.stop(0)


def parts_received(replicas) -> dict[str, list[tuple[int, int]]]:
    return {r.name: [(m.first_index, m.n) for m in r.received] for r in replicas}


def test_a_request_of_several_sequences_is_split_over_the_idle_replicas(replicas, router):
    with BassClient(router.address, timeout_s=10) as c:
        reply = c.generate("p", n=5)
    got = parts_received(replicas)
    assert sorted(got.values()) == [[(0, 3)], [(3, 2)]]
    first = next(name for name, parts in got.items() if parts == [(0, 3)])
    second = "b" if first == "a" else "a"
    assert [(s.index, s.text) for s in reply.sequences] == [(0, first), (1, first), (2, first),
                                                            (3, second), (4, second)]
    metrics = scrape(router.metrics_server.address)
    assert metrics[("bass_router_split_requests_total", (("parts", "2"),))] == 1
    with BassClient(router.address, timeout_s=10) as c:  # one sequence: never split
        c.generate("p", n=1)
    assert sum(len(r.received) for r in replicas) == 3


def test_a_replica_without_room_gets_no_part(replicas):
    a, b = replicas
    a.running = 7  # 8 KV slots: room for one more sequence, not for a part of 2
    router = start_router(replicas)
    try:
        seen = router.replicas.replicas[a.address]
        wait_until(lambda: seen.load is not None and seen.load.running_sequences == 7)
        with BassClient(router.address, timeout_s=10) as c:
            reply = c.generate("p", n=4)
        assert [s.text for s in reply.sequences] == ["b"] * 4
        assert parts_received(replicas) == {"a": [], "b": [(0, 4)]}
        with BassClient(router.address, timeout_s=10) as c:
            c.generate("p", n=3)  # 2 + 1 does not fit either (a's part would be the 2)
        assert parts_received(replicas)["a"] == []
    finally:
        router.stop(0)


def test_a_request_over_a_replicas_max_n_goes_whole_to_be_refused_as_it_would_be_anywhere(replicas, router):
    a, b = replicas
    a.max_n = b.max_n = 4
    wait_until(lambda: all(r.max_n == 4 for r in router.replicas.replicas.values()))
    with BassClient(router.address, timeout_s=10) as c:
        c.generate("p", n=6)  # the stand-ins answer it; a coordinator answers INVALID_ARGUMENT
        c.generate("p", n=4)
    assert sorted(p for r in replicas for p in parts_received(replicas)[r.name]) == [(0, 2), (0, 6), (2, 2)]


def test_splitting_can_be_turned_off_or_start_at_more_sequences(replicas):
    for threshold, n, whole in ((0, 8, True), (4, 3, True), (4, 4, False)):
        router = start_router(replicas, split_min_sequences=threshold)
        try:
            before = sum(len(r.received) for r in replicas)
            with BassClient(router.address, timeout_s=10) as c:
                assert [s.index for s in c.generate("p", n=n).sequences] == list(range(n))
            assert sum(len(r.received) for r in replicas) - before == (1 if whole else 2), (threshold, n)
        finally:
            router.stop(0)


def test_a_split_stream_merges_the_parts_deltas_and_closes_once(replicas, router):
    with BassClient(router.address, timeout_s=10) as c:
        messages = list(c.stream_raw("p", n=4))
    deltas = [(d.index, d.text) for m in messages for d in m.deltas]
    starts = {name: first for name, parts in parts_received(replicas).items() for first, _ in parts}
    assert sorted(starts.values()) == [0, 2]
    assert sorted(deltas) == sorted((starts[name], f"{name}{i}") for name in ("a", "b") for i in range(3))
    for name in ("a", "b"):  # each part's deltas in its own order
        assert [t for i, t in deltas if i == starts[name]] == [f"{name}0", f"{name}1", f"{name}2"]
    assert [m.HasField("stats") for m in messages] == [False] * (len(messages) - 1) + [True]
    assert messages[-1].stats.steps == 3 and not messages[-1].deltas


def test_a_part_whose_replica_fails_before_answering_is_retried_on_another(replicas, router):
    a, b = replicas
    a.fail = True
    with BassClient(router.address, timeout_s=10) as c:
        reply = c.generate("p", n=4)
        assert [(s.index, s.text) for s in reply.sequences] == [(i, "b") for i in range(4)]
        # The failure took a out, but its next poll (every POLL_S) would put it back while it
        # says it serves: as a replica whose target is down, it now says it does not. With one
        # replica serving, the next request goes whole.
        a.serving = False
        wait_until(lambda: [r.address for r in router.replicas.serving()] == [b.address])
        messages = list(c.stream_raw("p", n=4))
    assert sorted(parts_received(replicas)["b"]) == [(0, 2), (0, 4), (2, 2)]
    assert len(parts_received(replicas)["a"]) == 1
    assert {d.index for m in messages for d in m.deltas} == {0}


def test_a_part_refused_fails_the_request_and_cancels_the_other_part(replicas, router):
    a, b = replicas
    a.invalid = True
    a.hold.clear()
    b.hold.clear()  # b's part waits: the refusal must cancel it, not wait for it
    try:
        with BassClient(router.address, timeout_s=10) as c, futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(c.generate, "p", n=2)
            wait_until(lambda: a.received and b.received)
            started = time.monotonic()
            a.hold.set()
            with pytest.raises(grpc.RpcError) as info:
                call.result()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "temperature: must be a finite number >= 0"
        assert time.monotonic() - started < 5
        assert b.cancelled.wait(5), "the other part's call was not cancelled"
        assert len(a.received) == 1  # the request's fault: not retried elsewhere
    finally:
        a.hold.set()
        b.hold.set()


def test_a_clients_cancel_reaches_every_part(replicas, router):
    for r in replicas:
        r.hold.clear()
    try:
        with BassClient(router.address, timeout_s=10) as c:
            stream = c.stub.GenerateStream(build_request("p", n=2), timeout=10)
            wait_until(lambda: all(r.received for r in replicas))
            stream.cancel()
        for r in replicas:
            assert r.cancelled.wait(5), f"{r.name}'s part was not cancelled"
    finally:
        for r in replicas:
            r.hold.set()


# -- in front of real coordinators (tiny models, in this process) -------------------------------------
@pytest.fixture(scope="module")
def real(llama_target, llama_draft):
    from services import start_services

    stacks = [start_services(llama_target, llama_draft, colocate=True, num_slots=8, max_batch_size=8,
                             policy="fixed") for _ in range(2)]
    router = router_module.serve(RouterConfig(replicas=tuple(s.address for s in stacks), port=0, metrics_port=0,
                                              poll_interval_s=POLL_S))
    yield router, stacks
    router.stop(0)
    for s in stacks:
        s.stop()


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 11}], ids=["greedy", "seeded"])
def test_a_split_request_samples_the_sequences_of_the_whole(real, sampling):
    router, stacks = real
    prompt, kw = [5, 17, 33, 2], dict(n=4, max_new_tokens=12, ignore_eos=True, **sampling)
    with BassClient(stacks[0].address, timeout_s=60) as direct:
        whole = direct.generate(prompt, **kw)
    with BassClient(router.address, timeout_s=60) as c:
        split = c.generate(prompt, **kw)
        streamed = list(c.stream_raw(prompt, **kw))
    want = [list(s.token_ids) for s in whole.sequences]
    assert [list(s.token_ids) for s in split.sequences] == want
    assert [s.text for s in split.sequences] == [s.text for s in whole.sequences]
    if sampling:
        assert len({tuple(t) for t in want}) > 1  # the keys differ by index: not one sequence four times
    assert sorted(s.finish_order for s in split.sequences) == [1, 2, 3, 4]
    assert all(s.finish_ms > 0 for s in split.sequences)
    assert split.stats.generated_tokens == whole.stats.generated_tokens == 48
    tokens: dict[int, list[int]] = {}
    for m in streamed:
        for d in m.deltas:
            tokens.setdefault(d.index, []).extend(d.token_ids)
    assert [tokens[i] for i in range(4)] == want
    assert streamed[-1].stats.generated_tokens == 48
    assert sum(m.HasField("stats") for m in streamed) == 1
    split_requests = scrape(router.metrics_server.address)[("bass_router_split_requests_total", (("parts", "2"),))]
    assert split_requests >= 2  # this test's unary request and stream at least


def test_both_real_replicas_run_a_part_at_once(real):
    router, stacks = real
    from test_router import replica_load

    with BassClient(router.address, timeout_s=60) as c:
        stream = c.stub.GenerateStream(build_request([5, 17, 33], n=4, max_new_tokens=400, ignore_eos=True), timeout=60)
        next(stream)
        wait_until(lambda: [replica_load(s.address).running_sequences for s in stacks] == [2, 2])
        stream.cancel()
        wait_until(lambda: all(replica_load(s.address).running_sequences == 0 for s in stacks))


def test_concurrent_split_requests_each_get_their_own_sequences(real):
    router, _ = real
    prompts = [[5, 17, 33], [9, 8, 7, 6], [1, 2]]
    with BassClient(router.address, timeout_s=60) as c:
        alone = [[list(s.token_ids) for s in c.generate(p, n=3, max_new_tokens=8, ignore_eos=True).sequences]
                 for p in prompts]
    with futures.ThreadPoolExecutor(3) as pool, BassClient(router.address, timeout_s=60) as c:
        got = list(pool.map(lambda p: [list(s.token_ids) for s in
                                       c.generate(p, n=3, max_new_tokens=8, ignore_eos=True).sequences], prompts))
    assert got == alone


def test_a_request_a_real_replica_would_refuse_is_refused_through_the_router_too(real):
    from test_router import replica_load

    router, stacks = real
    limit = replica_load(stacks[0].address).max_n
    assert limit >= 2
    with BassClient(router.address, timeout_s=60) as c:
        with pytest.raises(grpc.RpcError) as info:  # two parts would each be within the limit
            c.generate([5, 17, 33], n=limit + 1, max_new_tokens=4)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == f"n: {limit + 1} exceeds the limit of {limit}"
