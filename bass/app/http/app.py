"""The Starlette application: OpenAI routes over the coordinator's gRPC API (grpc.aio).

Each request becomes one bass.v1 call. A client that goes away cancels that call, which frees
its sequences' KV slots in the coordinator: a stream's generator is cancelled by Starlette when
the client disconnects, and a plain request races its call against the disconnect."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

import anyio
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bass.app.client import build_request
from bass.app.http import errors, params
from bass.app.http.errors import ApiError
from bass.app.http.prompts import Prompts
from bass.app.http.responses import Answer, sse
from bass.core.config import HttpConfig
from bass.v1 import generation_pb2_grpc

GENERATION_SERVICE = "bass.v1.Generation"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer


class Front:
    """The front's state: its config, the tokenizer, and (while serving) one channel to the coordinator."""

    def __init__(self, config: HttpConfig, prompts: Prompts | None = None):
        self.config = config
        self.model = config.served_model_name
        self.prompts = prompts or Prompts(config.tokenizer_dir, config.chat_template)
        self.created = int(time.time())
        self.channel: grpc.aio.Channel | None = None

    async def open(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.config.coordinator_address, options=[
            ("grpc.max_send_message_length", self.config.max_request_bytes + 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        self.generation = generation_pb2_grpc.GenerationStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close(grace=None)


async def read_json(request: Request, limit: int):
    size, chunks = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        raise errors.bad_param("body", f"is not JSON ({e})") from None


async def until_disconnected(request: Request, awaitable, call):
    """`awaitable`'s result, or None if the client disconnects first (then `call` is cancelled)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def result():
        return await awaitable

    work, watch = asyncio.ensure_future(result()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            call.cancel()
            work.cancel()
        watch.cancel()
    return work.result() if not work.cancelled() else None


def prompt_ids(front: Front, plan: params.Plan) -> list[int]:
    if plan.messages is not None:
        return front.prompts.render_chat(plan.messages)
    if isinstance(plan.prompt, str):
        return front.prompts.encode(plan.prompt)
    return plan.prompt


async def generate(front: Front, request: Request, chat: bool) -> Response:
    body = await read_json(request, front.config.max_request_bytes)
    plan = params.parse(body, chat=chat)
    ids = await anyio.to_thread.run_sync(prompt_ids, front, plan)
    message = build_request(ids, **plan.options)
    answer = Answer(front.model, chat, len(ids))
    if plan.stream:
        return await stream(front, request, message, plan, answer)
    call = front.generation.Generate(message)
    try:
        result = await until_disconnected(request, call, call)
    except grpc.aio.AioRpcError as e:
        raise errors.from_grpc(e, plan.field_names) from None
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(answer.response(result))


async def stream(front: Front, request: Request, message, plan: params.Plan, answer: Answer) -> Response:
    call = front.generation.GenerateStream(message)
    try:  # the first message (or the call's refusal) comes before the status line, so errors keep theirs
        first = await until_disconnected(request, call.read(), call)
    except grpc.aio.AioRpcError as e:
        raise errors.from_grpc(e, plan.field_names) from None
    if first is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def events():
        try:
            for chunk in answer.first_chunks(plan.options["n"]):
                yield sse(chunk)
            msg, generated = first, 0
            while msg is not grpc.aio.EOF:
                for delta in msg.deltas:
                    chunks = answer.delta_chunks(delta)
                    generated += len(delta.token_ids)
                    if plan.continuous_usage:
                        chunks = answer.with_usage(chunks, generated)
                    for chunk in chunks:
                        yield sse(chunk)
                if msg.HasField("stats") and plan.include_usage:
                    yield sse(answer.usage_chunk(msg.stats))
                msg = await call.read()
        except grpc.aio.AioRpcError as e:  # e.g. the target died mid-stream
            yield sse(errors.from_grpc(e, plan.field_names).body())
        finally:
            call.cancel()  # the client went away (Starlette cancels us) or the call is over: a no-op then
        yield sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def build_app(config: HttpConfig, prompts: Prompts | None = None) -> Starlette:
    front = Front(config, prompts)

    async def completions(request: Request) -> Response:
        return await generate(front, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(front, request, chat=True)

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": front.model, "object": "model", "created": front.created, "owned_by": "bass"}]})

    async def health(_request: Request) -> Response:
        try:
            reply = await front.health.Check(health_pb2.HealthCheckRequest(service=GENERATION_SERVICE), timeout=5)
        except grpc.aio.AioRpcError as e:
            raise ApiError(503, f"the coordinator does not answer: {e.details()}", type="service_unavailable") from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise ApiError(503, "the coordinator is not serving", type="service_unavailable")
        return JSONResponse({"status": "ok"})

    async def api_error(_request: Request, e: ApiError) -> Response:
        return JSONResponse(e.body(), status_code=e.status)

    async def http_error(_request: Request, e: HTTPException) -> Response:
        return JSONResponse(ApiError(e.status_code, e.detail, code=str(e.status_code)).body(),
                            status_code=e.status_code, headers=e.headers)

    async def internal_error(_request: Request, e: Exception) -> Response:
        return JSONResponse(ApiError(500, f"internal error: {type(e).__name__}", type="internal_error").body(),
                            status_code=500)

    @asynccontextmanager
    async def lifespan(_app):
        await front.open()
        yield
        await front.close()

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan)
