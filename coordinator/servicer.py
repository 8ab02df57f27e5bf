"""bass.v1.Generation: the public API, thin over CoordinatorEngine."""

from __future__ import annotations

import math

from bass.coordinator.engine import CoordinatorEngine, Delta, Done, Failed, Load
from bass.coordinator.requests import FinishReason, GenerationRequest, GenerationResult, RequestStats
from bass.core.config import SamplingParams
from bass.core.errors import BassError, InvalidRequestError
from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc

SERVICE_NAME = "bass.v1.Generation"
REPLICA_SERVICE_NAME = "bass.v1.Replica"
DEFAULT_MAX_NEW_TOKENS = 128

FINISH_REASONS = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
                  FinishReason.TIME_BUDGET: pb.FINISH_REASON_TIME_BUDGET, None: pb.FINISH_REASON_UNSPECIFIED}


def request_from_proto(m: pb.GenerateRequest) -> GenerationRequest:
    which = m.WhichOneof("input")
    if which is None:
        raise InvalidRequestError("prompt", "set prompt or prompt_token_ids")
    for name in ("temperature", "top_p"):
        if not math.isfinite(getattr(m, name)):
            raise InvalidRequestError(name, "must be a finite number")
    sampling = SamplingParams(temperature=m.temperature, top_k=m.top_k, top_p=m.top_p if m.top_p != 0 else 1.0)
    return GenerationRequest(
        prompt=m.prompt if which == "prompt" else None,
        prompt_ids=tuple(m.prompt_token_ids.ids) if which == "prompt_token_ids" else None,
        n=m.n or 1, max_new_tokens=m.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, sampling=sampling,
        seed=m.seed if m.HasField("seed") else None, stop=tuple(m.stop), stop_token_ids=tuple(m.stop_token_ids),
        ignore_eos=m.ignore_eos, speculate=not m.disable_speculation, time_budget_ms=m.time_budget_ms,
        first_index=m.first_index)


def stats_to_proto(s: RequestStats) -> pb.Stats:
    return pb.Stats(steps=s.steps, draft_tokens=s.draft_tokens, accepted_tokens=s.accepted_tokens,
                    generated_tokens=s.generated_tokens, acceptance_rate=s.acceptance_rate,
                    time_ms=s.wall_time_s * 1000, queue_ms=s.queue_time_s * 1000)


def result_to_proto(r: GenerationResult) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        sequences=[pb.Sequence(index=s.index, text=s.text, token_ids=s.token_ids,
                               finish_reason=FINISH_REASONS[s.finish_reason], finish_order=s.finish_order,
                               finish_ms=s.finish_ms)
                   for s in r.sequences],
        stats=stats_to_proto(r.stats))


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, engine: CoordinatorEngine):
        self.engine = engine

    def _submit(self, message: pb.GenerateRequest, stream: bool):
        """Every request enters here, so here is where the ones refused at the door are counted
        (the engine counts those it answers)."""
        try:
            return self.engine.submit(request_from_proto(message), stream=stream)
        except BassError as exc:
            self.engine.metrics.request_failed(exc)
            raise

    def Generate(self, request, context):
        handle = self._submit(request, stream=False)
        context.add_callback(lambda: self.engine.cancel(handle))  # client gone or deadline passed
        for event in handle:
            if isinstance(event, Done):
                return result_to_proto(event.result)
            if isinstance(event, Failed):
                raise event.error

    def GenerateStream(self, request, context):
        handle = self._submit(request, stream=True)
        context.add_callback(lambda: self.engine.cancel(handle))
        for event in handle:
            if isinstance(event, Delta):
                yield pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(
                    index=event.index, token_ids=event.token_ids, text=event.text,
                    finish_reason=FINISH_REASONS[event.finish_reason])])
            elif isinstance(event, Done):
                yield pb.GenerateStreamResponse(stats=stats_to_proto(event.result.stats))
            elif isinstance(event, Failed):
                raise event.error

    def register(self, server) -> None:
        generation_pb2_grpc.add_GenerationServicer_to_server(self, server)


def load_to_proto(load: Load) -> pb.LoadResponse:
    return pb.LoadResponse(serving=load.serving, running_sequences=load.running_sequences,
                           queued_sequences=load.queued_sequences, queued_requests=load.queued_requests,
                           kv_slots=load.kv_slots, max_batch_size=load.max_batch_size, max_waiting=load.max_waiting,
                           max_n=load.max_n)


class ReplicaServicer(generation_pb2_grpc.ReplicaServicer):
    """bass.v1.Replica: the load a router in front of several coordinators balances by."""

    def __init__(self, engine: CoordinatorEngine):
        self.engine = engine

    def Load(self, request, context):
        return load_to_proto(self.engine.load())

    def register(self, server) -> None:
        generation_pb2_grpc.add_ReplicaServicer_to_server(self, server)
