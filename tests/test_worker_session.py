"""The worker Session stream (bass/transport/remote_session.py, bass/transport/worker_session.py) against a
real gRPC server over a stand-in worker: same answers and same errors as the unary calls, a
worker dying mid-call or hanging fails the call promptly, and a probe reconnects."""

import dataclasses
import threading
import time

import grpc
import pytest

from bass.core.config import SamplingParams
from bass.core.errors import InvalidRequestError, UnknownSequenceError, WorkerUnavailableError
from bass.core.worker_api import SequenceSampling, Verdict, VerifyItem, VerifyRequest, VerifyResponse, WorkerInfo
from bass.target_service.servicer import SERVICE_NAME, TargetServicer
from bass.transport import wire
from bass.transport.grpc_server import start_server
from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker
from bass.v1 import worker_pb2 as pb

SAMPLING = SequenceSampling(SamplingParams(), seed_key=3)


def one_sequence(seq_id: int) -> pb.VerifyRequest:
    return wire.verify_request_to_proto(VerifyRequest([VerifyItem(seq_id, (), SAMPLING)]))


class _Runner:
    def __init__(self):
        self.sequences = {}
        self.cache = type("Cache", (), {"free_slots": 8})()


class FakeTarget:
    """Verify accepts every draft token and adds seq_id; seq_id 0 is a bad request, 404 unknown,
    500 a bug, and 77 blocks until `release_hang` is set."""

    def __init__(self):
        self.runner = _Runner()
        self.release_hang = threading.Event()
        self.entered_hang = threading.Event()
        self.released, self.resets = [], 0

    def info(self):
        return WorkerInfo("fake", 1000, 8, 64, "float32", "cpu")

    def verify(self, request):
        for item in request.items:
            if item.seq_id == 0:
                raise InvalidRequestError("items[0].seq_id", "must be > 0")
            if item.seq_id == 404:
                raise UnknownSequenceError(404)
            if item.seq_id == 500:
                raise RuntimeError("a bug")
            if item.seq_id == 77:
                self.entered_hang.set()
                self.release_hang.wait(30)
        return VerifyResponse([Verdict(len(i.draft_tokens), [*i.draft_tokens, i.seq_id]) for i in request.items],
                              compute_s=0.001)

    def release(self, seq_ids):
        self.released.extend(seq_ids)

    def reset(self):
        self.resets += 1


def serve(worker, port=0):
    return start_server([TargetServicer(worker).register], [SERVICE_NAME], port=port, engine=worker)


def request(*seq_ids):
    return VerifyRequest(items=[VerifyItem(s, (s + 1, s + 2), SAMPLING) for s in seq_ids])


@pytest.fixture
def worker():
    return FakeTarget()


@pytest.fixture
def server(worker):
    s = serve(worker)
    yield s
    worker.release_hang.set()
    s.stop(0)


def test_session_answers_like_unary_calls_on_one_stream(server, worker):
    session, unary = RemoteTargetWorker(server.address), RemoteTargetWorker(server.address, transport="unary")
    try:
        for ids in [(1, 2, 3), (9,), ()]:
            assert session.verify(request(*ids)) == unary.verify(request(*ids))
        stream = session._session
        session.release([4, 5])
        session.reset()
        info = session.info()
        assert info == unary.info() and info.instance_id
        assert dataclasses.replace(info, instance_id="") == worker.info()
        assert session._session is stream and not stream.ended, "every call rode the same stream"
        assert worker.released == [4, 5] and worker.resets == 1
    finally:
        session.close()
        unary.close()


def test_calls_sent_ahead_are_answered_in_order_and_a_discarded_answer_is_dropped(server, worker):
    client = RemoteTargetWorker(server.address)
    try:
        assert client.overlaps_calls and client.steps_in_flight == 2
        first, second, third = (client.start_verify(request(s)) for s in (1, 2, 3))
        bad = client.start_verify(request(0))
        assert second.result().verdicts[0].tokens == [3, 4, 2]  # reads past the first answer, kept
        first.discard()  # already read: dropped from where it was kept
        last = client.start_verify(request(5))
        with pytest.raises(InvalidRequestError):  # an error answers its own call only
            bad.result()
        third.discard()  # not read yet: dropped when it comes
        assert last.result().verdicts[0].tokens == [6, 7, 5]
        session = client._session
        assert not session._early and not session._discarded and not session._unanswered
        assert client.verify(request(8)).verdicts[0].tokens == [9, 10, 8] and client._session is session
    finally:
        client.close()


@pytest.mark.parametrize("transport", ["session", "unary"])
def test_errors_map_as_for_unary_calls(server, transport):
    client = RemoteTargetWorker(server.address, transport=transport)
    try:
        with pytest.raises(InvalidRequestError, match="seq_id"):
            client.verify(request(0))
        assert client.verify(request(1)).verdicts[0].tokens == [2, 3, 1], "a bad request leaves the worker usable"
        for bad in (404, 500):
            with pytest.raises(WorkerUnavailableError, match="NOT_FOUND" if bad == 404 else "INTERNAL"):
                client.verify(request(bad))
            assert client._broken
            client.info()  # the probe, as the scheduler does before using the worker again
            assert client.verify(request(2)).verdicts[0].tokens == [3, 4, 2]
    finally:
        client.close()


def test_error_frames_carry_the_unary_status_codes(server):
    channel = grpc.insecure_channel(server.address)
    try:
        from bass.v1 import worker_pb2_grpc
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        calls = [pb.WorkerCall(call_id=i + 1, verify=one_sequence(s)) for i, s in enumerate((0, 404, 500, 1))]
        calls.append(pb.WorkerCall(call_id=9, propose=pb.ProposeRequest()))  # a target does not propose
        replies = list(stub.Session(iter(calls), timeout=10))
        assert [r.call_id for r in replies] == [1, 2, 3, 4, 9]
        codes = [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INTERNAL]
        for reply, code in zip(replies, codes):
            assert reply.WhichOneof("body") == "error" and reply.error.code == code.value[0]
            with pytest.raises(grpc.RpcError) as unary:
                stub.Verify(one_sequence({0: 0, 1: 404, 2: 500}[codes.index(code)]))
            assert unary.value.code() == code
        assert list(replies[3].verify.tokens) == [1]
        assert replies[4].error.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    finally:
        channel.close()


@pytest.mark.parametrize("malformed, says", [
    (dict(seq_ids=[1, 2], draft_counts=[0]), "one entry per sequence (2)"),
    (dict(seq_ids=[1], draft_counts=[2], draft_tokens=[5]), "add up to 2 tokens, but 1 were sent"),
    (dict(seq_ids=[1], draft_counts=[0], sampling=pb.SamplingColumns(temperature=[0.0])), "sampling"),
])
def test_inconsistent_columns_are_invalid_argument_on_both_transports(server, malformed, says):
    """A request whose columns disagree (a client built by hand, another version) is the
    caller's error with a message naming the column, never a worker failure."""
    channel = grpc.insecure_channel(server.address)
    try:
        from bass.v1 import worker_pb2_grpc
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        request = pb.VerifyRequest(**malformed)
        with pytest.raises(grpc.RpcError) as unary:
            stub.Verify(request, timeout=10)
        assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in unary.value.details()
        reply, after = stub.Session(iter([pb.WorkerCall(call_id=1, verify=request),
                                          pb.WorkerCall(call_id=2, verify=one_sequence(3))]), timeout=10)
        assert reply.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and says in reply.error.message
        assert list(after.verify.tokens) == [3], "the stream carries on after a malformed call"
    finally:
        channel.close()


def test_undecodable_frame_ends_the_stream_invalid_argument(server):
    channel = grpc.insecure_channel(server.address)
    try:
        session = channel.stream_stream("/bass.v1.TargetWorker/Session")  # raw bytes both ways
        with pytest.raises(grpc.RpcError) as info:
            list(session(iter([b"\xff\xff\xff"]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "decoded" in info.value.details()
    finally:
        channel.close()


def test_worker_dying_mid_call_fails_it_promptly_then_a_probe_reconnects(worker):
    server = serve(worker)
    port = server.port
    client = RemoteTargetWorker(server.address)
    try:
        assert client.verify(request(1)).verdicts[0].accepted == 2
        outcome = {}

        def hang():
            try:
                client.verify(request(77))
            except WorkerUnavailableError as exc:
                outcome["error"], outcome["at"] = exc, time.monotonic()

        caller = threading.Thread(target=hang)
        caller.start()
        assert worker.entered_hang.wait(10)
        stopped = time.monotonic()
        server.server.stop(0)  # the process dies: its streams are cut, the handler is still in the model
        caller.join(10)
        assert "error" in outcome and outcome["at"] - stopped < 2.0
        with pytest.raises(WorkerUnavailableError):
            client.info()  # nothing listens
        worker.release_hang.set()
        server = serve(FakeTarget(), port=port)  # back on the same address
        # The channel retries the address on gRPC's reconnect backoff (about 1 s after the
        # refusal above), as the scheduler's periodic probe does: a probe within 5 s finds it.
        deadline = time.monotonic() + 5.0
        while True:
            try:
                info = client.info()
                break
            except WorkerUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert info.model_name == "fake"
        assert client.verify(request(5)).verdicts[0].tokens == [6, 7, 5]
    finally:
        client.close()
        server.stop(0)


def test_a_hung_worker_times_the_call_out(server, worker):
    client = RemoteTargetWorker(server.address, timeout_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerUnavailableError, match="DEADLINE_EXCEEDED"):
            client.verify(request(77))
        assert 0.5 <= time.monotonic() - t0 < 3.0
        worker.release_hang.set()
        client.info()
        assert client.verify(request(3)).verdicts[0].accepted == 2
    finally:
        client.close()


def test_draft_client_defaults_to_the_session():
    assert RemoteDraftWorker("127.0.0.1:1").transport == "session"
    with pytest.raises(ValueError):
        RemoteTargetWorker("127.0.0.1:1", transport="carrier-pigeon")


class OverlappingFakeTarget(FakeTarget):
    """FakeTarget whose Verify has two halves, like TargetWorker: `start_verify`, then the
    pending call's `result`. A started call reports itself done `busy_s` after it starts."""

    def __init__(self, busy_s: float):
        super().__init__()
        self.busy_s, self.events = busy_s, []

    def start_verify(self, request):
        ids = tuple(item.seq_id for item in request.items)
        if 0 in ids:
            raise InvalidRequestError("items[0].seq_id", "must be > 0")
        self.events.append(("start", ids))
        worker, started = self, time.monotonic()

        class Pending:
            def ready(self):
                return time.monotonic() - started >= worker.busy_s

            def result(self):
                worker.events.append(("finish", ids))
                return FakeTarget.verify(worker, request)

        return Pending()


def test_pipelined_calls_start_ahead_of_the_answer_before_and_are_answered_in_order():
    """Three pipelined Verify frames sent at once: each is launched before the one before it is
    answered (the worker's GPU goes from step to step), answers go out in order, a call whose
    launch fails is answered in its place, and the last is answered when the client half-closes."""
    worker = OverlappingFakeTarget(busy_s=30.0)  # never done by itself: only the next frame moves it on
    server = serve(worker)
    channel = grpc.insecure_channel(server.address)
    try:
        from bass.v1 import worker_pb2_grpc
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        calls = [pb.WorkerCall(call_id=i + 1, verify=one_sequence(s), pipelined=True) for i, s in enumerate((1, 2, 0, 3))]
        replies = list(stub.Session(iter(calls), timeout=10))
        assert [r.call_id for r in replies] == [1, 2, 3, 4]
        assert [list(r.verify.tokens) for r in replies[:2]] == [[1], [2]] and list(replies[3].verify.tokens) == [3]
        assert replies[2].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert worker.events == [("start", (1,)), ("start", (2,)), ("finish", (1,)),
                                 ("finish", (2,)), ("start", (3,)), ("finish", (3,))]
    finally:
        channel.close()
        server.stop(0)


def test_a_pipelined_call_with_nothing_after_it_is_answered_once_done():
    """The client sends one pipelined call and waits for it (the last step of a run): the worker
    answers as soon as the call is done, without waiting for a frame that will not come."""
    worker = OverlappingFakeTarget(busy_s=0.05)
    server = serve(worker)
    client = RemoteTargetWorker(server.address)
    try:
        started = time.monotonic()
        assert client.start_verify(request(4)).result().verdicts[0].tokens == [5, 6, 4]
        assert 0.05 <= time.monotonic() - started < 5
        assert client.verify(request(7)).verdicts[0].tokens == [8, 9, 7]  # an unpipelined call: the plain handler
        assert worker.events == [("start", (4,)), ("finish", (4,))]
    finally:
        client.close()
        server.stop(0)
