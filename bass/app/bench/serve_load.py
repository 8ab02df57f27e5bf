"""The load generator: GenerateStream calls sent open-loop (at planned offsets, whatever the
server's state) or closed-loop (N clients, each sending its next request when the last ends).

One asyncio loop over one grpc.aio channel: hundreds of concurrent streams without a thread
each, and every delta timestamped when the loop receives it. With protocol "openai" the same
loops send streamed /v1/completions to an OpenAI-compatible server instead (serve_openai).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Callable, Iterable, Iterator

import grpc

from bass.app.bench.serve_records import DeltaEvent, RequestRecord
from bass.app.bench.serve_workload import Arrival, RequestSpec
from bass.app.client import FINISH_REASON_NAMES, build_request
from bass.v1 import generation_pb2_grpc

# Large enough for hundreds of streams on one connection; the server's own limits decide.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20)]

OnDone = Callable[[RequestRecord], None]
CONNECT_TIMEOUT_S = 60.0


async def _connect(channel, address: str) -> None:
    try:
        await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ConnectionError(f"no Generation service answers at {address}") from None


def to_request(spec: RequestSpec):
    return build_request(spec.prompt.text, n=spec.n, max_new_tokens=spec.max_new_tokens,
                         temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed, speculate=spec.speculate)


async def _stream_one(stub, spec: RequestSpec, scheduled_s: float, start: float, timeout_s: float) -> RequestRecord:
    sent = time.perf_counter()
    record = RequestRecord(spec=spec, scheduled_s=scheduled_s, sent_s=sent - start)
    call = stub.GenerateStream(to_request(spec), timeout=timeout_s)
    try:
        async for message in call:
            now = time.perf_counter() - sent
            for d in message.deltas:
                record.deltas.append(DeltaEvent(now, d.index, tuple(d.token_ids), d.text,
                                                FINISH_REASON_NAMES.get(d.finish_reason)))
            if message.HasField("stats"):
                record.stats_generated_tokens = message.stats.generated_tokens
        record.latency_s = time.perf_counter() - sent
    except grpc.aio.AioRpcError as e:
        record.status, record.detail = e.code().name, e.details() or ""
        record.latency_s = time.perf_counter() - sent
    return record


@asynccontextmanager
async def grpc_sender(address: str, timeout_s: float):
    """Yields send(spec, scheduled_s, start) -> RequestRecord over one grpc.aio channel."""
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        await _connect(channel, address)
        yield lambda spec, scheduled_s, start: _stream_one(stub, spec, scheduled_s, start, timeout_s)


def _sender(address: str, timeout_s: float, protocol: str):
    if protocol == "openai":
        from bass.app.bench.serve_openai import openai_sender

        return openai_sender(address, timeout_s)
    if protocol != "grpc":
        raise ValueError(f"protocol must be grpc or openai, got {protocol!r}")
    return grpc_sender(address, timeout_s)


async def _open_loop(sender, arrivals: list[Arrival], on_done: OnDone | None):
    async with sender as send:
        start = time.perf_counter()

        async def one(a: Arrival) -> RequestRecord:
            await asyncio.sleep(max(0.0, a.offset_s - (time.perf_counter() - start)))
            record = await send(a.spec, a.offset_s, start)
            if on_done:
                on_done(record)
            return record

        return list(await asyncio.gather(*(one(a) for a in arrivals)))


async def _closed_loop(sender, specs: Iterator[RequestSpec], concurrency: int, duration_s: float | None,
                       on_done: OnDone | None):
    async with sender as send:
        start = time.perf_counter()
        records: list[RequestRecord] = []

        async def client() -> None:
            while duration_s is None or time.perf_counter() - start < duration_s:
                spec = next(specs, None)
                if spec is None:
                    return
                record = await send(spec, time.perf_counter() - start, start)
                records.append(record)
                if on_done:
                    on_done(record)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return records


def run_open_loop(address: str, arrivals: list[Arrival], *, timeout_s: float = 600.0,
                  on_done: OnDone | None = None, protocol: str = "grpc") -> list[RequestRecord]:
    """Send each arrival at its offset from the start; return their records in arrival order.
    protocol "openai": `address` is an OpenAI-compatible base URL (http://HOST:PORT/v1)."""
    return asyncio.run(_open_loop(_sender(address, timeout_s, protocol), arrivals, on_done))


def run_closed_loop(address: str, specs: Iterable[RequestSpec], concurrency: int, *, duration_s: float | None = None,
                    timeout_s: float = 600.0, on_done: OnDone | None = None,
                    protocol: str = "grpc") -> list[RequestRecord]:
    """`concurrency` clients take the specs in order, one request at a time each, until the
    specs run out or `duration_s` has passed (requests in flight then still finish)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    return asyncio.run(_closed_loop(_sender(address, timeout_s, protocol), iter(specs), concurrency, duration_s,
                                    on_done))
