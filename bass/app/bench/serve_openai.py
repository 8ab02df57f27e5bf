"""`bass bench serve --openai URL`: the same arrivals, prompts, checks and report against any
OpenAI-compatible server (BASS's HTTP front, vLLM, ...), through streamed `/v1/completions`.

Tokens per chunk come from `stream_options.continuous_usage_stats` (the usage so far on every
chunk; BASS's front and vLLM give it); from a server without it each chunk that carries text
counts as one token, as vLLM's own benchmark counts them. The API returns no token ids, so the
correctness check compares each answer's text with its reference (sent alone, unstreamed).
Errors are counted by HTTP status (`HTTP 429`), or `STREAM_ERROR` / `CONNECTION_ERROR`.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Callable, Iterable

from bass.app.bench.serve_records import DeltaEvent, RequestRecord
from bass.app.bench.serve_workload import RequestSpec

CONNECT_TIMEOUT_S = 60.0


def completion_body(spec: RequestSpec, model: str, stream: bool) -> dict:
    body = {"model": model, "prompt": spec.prompt.text, "n": spec.n, "max_tokens": spec.max_new_tokens,
            "temperature": spec.temperature, "top_p": spec.top_p}
    if spec.seed is not None:
        body["seed"] = spec.seed
    if not spec.speculate:
        body["bass"] = {"speculate": False}  # BASS's extension; other servers ignore it
    if stream:
        body.update(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    return body


def served_model(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """The first model the server lists (GET /v1/models); fails at once on a wrong URL."""
    import httpx2

    try:
        r = httpx2.get(f"{url.rstrip('/')}/models", timeout=timeout_s)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx2.HTTPError, ValueError, KeyError, IndexError) as e:
        raise ConnectionError(f"no OpenAI-compatible server answers at {url} ({e})") from None


def _error_detail(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode("utf-8", "replace")


async def _stream_one(client, url: str, model: str, spec: RequestSpec, scheduled_s: float, start: float,
                      timeout_s: float) -> RequestRecord:
    import httpx2

    sent = time.perf_counter()
    record = RequestRecord(spec=spec, scheduled_s=scheduled_s, sent_s=sent - start)
    counted, usage_seen = 0, False
    try:
        async with client.stream("POST", f"{url}/completions", json=completion_body(spec, model, True),
                                 timeout=timeout_s) as r:
            if r.status_code != 200:
                record.status, record.detail = f"HTTP {r.status_code}", _error_detail(await r.aread())
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        record.status, record.detail = "STREAM_ERROR", str(chunk["error"].get("message", ""))
                        break
                    now = time.perf_counter() - sent
                    usage = chunk.get("usage")
                    for choice in chunk.get("choices") or []:
                        text = choice.get("text") or ""
                        tokens = usage["completion_tokens"] - counted if usage else int(bool(text))
                        counted += tokens
                        # token ids are unknown here: placeholders that count them
                        record.deltas.append(DeltaEvent(now, choice["index"], (0,) * tokens, text,
                                                        choice.get("finish_reason")))
                    if usage:
                        usage_seen = True
                        if not chunk.get("choices"):  # the last chunk: the server's own count
                            record.stats_generated_tokens = usage["completion_tokens"]
        if record.ok and not usage_seen:
            record.stats_generated_tokens = counted  # nothing to check the count against
    except httpx2.TimeoutException as e:
        record.status, record.detail = "TIMEOUT", str(e)
    except (httpx2.HTTPError, ValueError) as e:
        record.status, record.detail = "CONNECTION_ERROR", str(e)
    record.latency_s = time.perf_counter() - sent
    return record


@asynccontextmanager
async def openai_sender(url: str, timeout_s: float):
    """Yields send(spec, scheduled_s, start) -> RequestRecord over one pooled HTTP client."""
    import httpx2

    url = url.rstrip("/")
    model = await asyncio.to_thread(served_model, url)
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(limits=limits, timeout=timeout_s) as client:
        yield lambda spec, scheduled_s, start: _stream_one(client, url, model, spec, scheduled_s, start, timeout_s)


def collect_references(url: str, specs: Iterable[RequestSpec], *, timeout_s: float = 600.0,
                       on_done: Callable[[], None] | None = None) -> dict:
    """Each distinct deterministic spec sent alone, unstreamed; answers without token ids (None)."""
    import httpx2

    from bass.app.bench.serve_check import Answer, ReferenceFailure

    url = url.rstrip("/")
    model = served_model(url)
    out = {}
    with httpx2.Client(timeout=timeout_s) as client:
        for spec in dict.fromkeys(s for s in specs if s.deterministic):
            try:
                r = client.post(f"{url}/completions", json=completion_body(spec, model, False))
                if r.status_code != 200:
                    out[spec] = ReferenceFailure(f"HTTP {r.status_code}", _error_detail(r.content))
                else:
                    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
                    out[spec] = Answer(tuple((None, c["text"]) for c in choices))
            except httpx2.HTTPError as e:
                out[spec] = ReferenceFailure("CONNECTION_ERROR", str(e))
            if on_done:
                on_done()
    return out
