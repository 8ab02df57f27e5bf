"""gRPC clients for the draft and target workers, with the same interface as in-process ones."""

from __future__ import annotations

from typing import Sequence

import grpc

from bass.core.errors import InvalidRequestError, PreconditionError, WorkerUnavailableError
from bass.core.worker_api import (ProposeRequest, ProposeResponse, StreamControl, VerifyRequest, VerifyResponse,
                                  WorkerInfo)
from bass.transport import wire
from bass.transport.draft_stream import RemoteDraftStream
from bass.transport.grpc_server import SERVER_OPTIONS
from bass.transport.remote_pair import PairPendingVerify, PairProposal, PairStep
from bass.transport.remote_session import Session, SessionError
from bass.v1 import worker_pb2 as pb
from bass.v1 import worker_pb2_grpc

# Info is the coordinator's reconnect probe (engine and scheduler both call it every
# reconnect_interval_s while a worker is down); it answers without waiting for the model, so a
# few seconds is plenty, and a worker whose host vanished must not stall the loop for long.
PROBE_TIMEOUT_S = 5.0


class _RemoteWorker:
    """transport: "session" (the default) sends Propose, Verify, Release and Reset as frames on one
    long-lived stream (bass/transport/remote_session.py), "unary" as one RPC each. Info, the reconnect
    probe, is always a unary call of its own, with its own short timeout."""

    stub_class: type

    def __init__(self, address: str, timeout_s: float = 120.0, transport: str = "session"):
        if transport not in ("session", "unary"):
            raise ValueError(f"transport must be 'session' or 'unary', got {transport!r}")
        self.address = address
        self.timeout_s = timeout_s
        self.transport = transport
        self._broken = False
        self._session: Session | None = None
        self.instance_id = ""  # the serving process, from the last Info
        self._open()

    def _open(self) -> None:
        self.channel = grpc.insecure_channel(self.address, options=SERVER_OPTIONS)
        self.stub = self.stub_class(self.channel)

    def _call(self, method: str, request, timeout_s: float | None = None):
        if self.transport == "session" and method != "Info":
            return self._start(method, request).result()
        try:
            return getattr(self.stub, method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            raise self._failed(method, e.code(), e.details()) from None

    def _start(self, method: str, request, pipelined: bool = False) -> "PendingCall":
        """Send a call without waiting for its answer (the session transport; a unary call is
        made at once). Raises the same errors as `_call`, from here or from `result`.
        pipelined: the caller may send its next call before reading this answer."""
        if self.transport != "session":
            return PendingCall(self, method, answer=self._call(method, request))
        if self._session is None or self._session.ended:
            self._session = Session(self.stub.Session, self.timeout_s)
        try:
            return PendingCall(self, method, session=self._session,
                               call_id=self._session.send(method.lower(), request, pipelined))
        except SessionError as e:
            raise self._failed(method, e.code, e.details) from None

    @property
    def overlaps_calls(self) -> bool:
        """Whether a call sent before the previous one is answered overlaps it (the session:
        the worker finds the next call waiting when it finishes the last)."""
        return self.transport == "session"

    @property
    def steps_in_flight(self) -> int:
        """Regular steps the scheduler keeps in flight after each commit: two over the session,
        since an answer's way back, the commit and the next frame's way out take longer than a
        step at 64 sequences (coordinator/regular_pipeline.py); the worker still runs one step ahead
        of another, and the next frame waits on its stream."""
        return 2 if self.transport == "session" else 1

    def _failed(self, method: str, code: grpc.StatusCode, details: str | None) -> Exception:
        """The same errors whatever the transport: INVALID_ARGUMENT is the caller's, anything else
        makes the worker unavailable until a probe (info) finds it again."""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidRequestError(f"{self.address}", details or "")
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return PreconditionError(f"worker at {self.address}: {method}: {details}")
        self.mark_broken()
        return WorkerUnavailableError(f"worker at {self.address}: {method} failed with {code.name}: {details}")

    def mark_broken(self) -> None:
        """The worker failed: the next probe (info) starts on a fresh channel and stream."""
        self._broken = True

    def info(self, timeout_s: float | None = None) -> WorkerInfo:
        """Also the reconnect probe: after a failure it opens a fresh channel first. A channel
        that failed to connect waits out gRPC's exponential reconnect backoff (1 s growing to
        120 s) and fails every call at once meanwhile, so a worker back after a long outage was
        found up to minutes late; a new channel connects at once, so a worker is found on the
        first probe after it serves. The session, bound to the old channel, goes with it."""
        if self._broken:
            self.close()
            self._open()
            self._broken = False
        info = wire.info_from_proto(self._call("Info", pb.InfoRequest(), timeout_s or PROBE_TIMEOUT_S))
        self.instance_id = info.instance_id
        return info

    def release(self, seq_ids: Sequence[int]) -> None:
        self._call("Release", pb.ReleaseRequest(seq_ids=list(seq_ids)))

    def reset(self) -> None:
        self._call("Reset", pb.ResetRequest())

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        self.channel.close()


class PendingCall:
    """A call sent to a worker; `result()` waits for its answer (once), `discard()` gives it up."""

    def __init__(self, worker: _RemoteWorker, method: str, *, answer=None, session: Session | None = None,
                 call_id: int = 0):
        self._worker, self._method, self._answer = worker, method, answer
        self._session, self._call_id = session, call_id

    def result(self):
        if self._session is None:
            return self._answer
        session, self._session = self._session, None
        try:
            return session.result(self._call_id)
        except SessionError as e:
            raise self._worker._failed(self._method, e.code, e.details) from None

    def discard(self) -> None:
        if self._session is not None:
            self._session.discard(self._call_id)
            self._session = None


class RemoteDraftWorker(_RemoteWorker):
    stub_class = worker_pb2_grpc.DraftWorkerStub

    def propose(self, request: ProposeRequest) -> ProposeResponse:
        return wire.propose_response_from_proto(self._call("Propose", wire.propose_request_to_proto(request)))

    def open_stream(self, first: StreamControl) -> RemoteDraftStream:
        """Streamed speculation: the draft drafts ahead on its own (bass/transport/draft_stream.py)."""
        return RemoteDraftStream(self.stub, self.address, first)

    # Where this draft shares the target's process (RemoteTargetWorker.verifies_device_drafts),
    # the scheduler drives it as an in-process draft on the target's device: bass/transport/remote_pair.py.
    def start_propose(self, request: ProposeRequest) -> PairProposal:
        return PairProposal(self, request)

    def chains(self, num_seqs: int, k: int, verified_k: int, sampled: bool, tail: int = 0) -> bool:
        """The worker decides (SpeculateResponse.chained): its graphs' shapes are its own, and
        so are the lookup tokens its target appends (it chains behind them itself)."""
        return k >= 1

    def start_chained(self, request: ProposeRequest, verdicts: PairStep, verified_k: int, tail: int = 0):
        return verdicts.chain(request, verified_k)


class RemoteTargetWorker(_RemoteWorker):
    stub_class = worker_pb2_grpc.TargetWorkerStub

    def __init__(self, address: str, timeout_s: float = 120.0, transport: str = "session",
                 draft: RemoteDraftWorker | None = None):
        """draft: the coordinator's draft; where both report one instance_id (one process, one
        device), each speculative step is one Speculate call."""
        super().__init__(address, timeout_s, transport)
        self.draft = draft

    @property
    def verifies_device_drafts(self) -> bool:
        """Whether the draft shares this worker's process, by the Info both last gave."""
        return self.draft is not None and bool(self.instance_id) and self.draft.instance_id == self.instance_id

    @property
    def speculates_ahead(self) -> bool:
        """Whether the scheduler may send a speculative step before the last one's answer is
        read (coordinator/speculative_ahead.py): a draft in this process, over the session,
        whose frames wait in the worker's stream."""
        return self.transport == "session" and self.verifies_device_drafts

    def mark_broken(self) -> None:
        """A draft in this process failed with it: its stream is gone too, so its first probe
        after the restart must not try the old one (that would cost a reconnect interval)."""
        if self.verifies_device_drafts:
            self.draft.mark_broken()
        super().mark_broken()

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        return PendingVerify(self._start("Verify", wire.verify_request_to_proto(request))).result()

    def start_verify(self, request: VerifyRequest, drafts: PairProposal | None = None):
        """Regular decoding's call: the next one is sent before this answer is read, and the
        worker may start it ahead (WorkerCall.pipelined). drafts: a co-located draft's
        proposal (its `on_device`), verified in the same Speculate call."""
        if drafts is not None:
            return PairPendingVerify(PairStep(self, drafts, request))
        return PendingVerify(self._start("Verify", wire.verify_request_to_proto(request), pipelined=True))

    def start_speculate(self, request: pb.SpeculateRequest) -> PendingCall:
        return self._start("Speculate", request)


class PendingVerify:
    """A Verify sent and not yet answered (see TargetWorkerAPI.start_verify)."""

    def __init__(self, call: PendingCall):
        self._call = call

    def result(self) -> VerifyResponse:
        return wire.verify_response_from_proto(self._call.result())

    def discard(self) -> None:
        self._call.discard()
