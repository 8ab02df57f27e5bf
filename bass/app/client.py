"""A small Python client for the public Generation service.

    from bass.app.client import BassClient

    with BassClient("127.0.0.1:50051") as client:
        result = client.generate("def fibonacci(n):", n=4, max_new_tokens=64, temperature=0.8, seed=1)
        for seq in result.sequences:
            print(seq.index, seq.finish_reason, seq.text)
        for delta in client.stream("def add(a, b):", max_new_tokens=32):
            print(delta.index, repr(delta.text))

Errors arrive as grpc.RpcError with a status code (INVALID_ARGUMENT names the bad field,
RESOURCE_EXHAUSTED means the queue is full, UNAVAILABLE means the target model is down).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import grpc

from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc

FINISH_REASON_NAMES = {pb.FINISH_REASON_UNSPECIFIED: None, pb.FINISH_REASON_STOP: "stop",
                       pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_TIME_BUDGET: "time_budget"}


def build_request(prompt: str | Sequence[int], *, n: int = 1, max_new_tokens: int = 128, temperature: float = 0.0,
                  top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop: Sequence[str] = (),
                  stop_token_ids: Sequence[int] = (), time_budget_ms: int = 0, speculate: bool = True,
                  ignore_eos: bool = False) -> pb.GenerateRequest:
    request = pb.GenerateRequest(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                 top_k=top_k, stop=list(stop), stop_token_ids=list(stop_token_ids),
                                 time_budget_ms=time_budget_ms, disable_speculation=not speculate,
                                 ignore_eos=ignore_eos)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.ids.extend(prompt)
    if seed is not None:
        request.seed = seed
    return request


class BassClient:
    def __init__(self, address: str, timeout_s: float | None = 600.0):
        self.channel = grpc.insecure_channel(address)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.timeout_s = timeout_s

    def generate(self, prompt: str | Sequence[int], **options) -> pb.GenerateResponse:
        """All sequences at once. Options as in build_request."""
        return self.stub.Generate(build_request(prompt, **options), timeout=self.timeout_s)

    def stream(self, prompt: str | Sequence[int], **options) -> Iterator[pb.SequenceDelta]:
        """Token deltas as they commit; the final message's stats are dropped (use stream_raw)."""
        for message in self.stream_raw(prompt, **options):
            yield from message.deltas

    def stream_raw(self, prompt: str | Sequence[int], **options) -> Iterator[pb.GenerateStreamResponse]:
        return self.stub.GenerateStream(build_request(prompt, **options), timeout=self.timeout_s)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "BassClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
