"""bass.v1 answers as OpenAI JSON: whole responses, stream chunks and server-sent events.

finish_reason is "stop" (EOS, a stop string or stop token), "length" (max_tokens) or, only for
a request that set `bass.time_budget_ms`, "time_budget" (the text is partial). Answers also carry
our step statistics under `bass` (absent from the stream's chunks, except the usage chunk)."""

from __future__ import annotations

import json
import math
import time
import uuid

from bass.app.client import FINISH_REASON_NAMES
from bass.v1 import generation_pb2 as pb


class Answer:
    """What every chunk and response of one request shares."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int):
        self.chat, self.model, self.prompt_tokens = chat, model, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, completion_tokens: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def response(self, r: pb.GenerateResponse) -> dict:
        if self.chat:
            choices = [{"index": s.index, "message": {"role": "assistant", "content": s.text},
                        "logprobs": None, "finish_reason": FINISH_REASON_NAMES[s.finish_reason]}
                       for s in r.sequences]
        else:
            choices = [{"index": s.index, "text": s.text, "logprobs": None,
                        "finish_reason": FINISH_REASON_NAMES[s.finish_reason]} for s in r.sequences]
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": self.usage(sum(len(s.token_ids) for s in r.sequences)), "bass": stats(r.stats)}

    def _chunk(self, choices: list[dict]) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}

    def first_chunks(self, n: int) -> list[dict]:
        """Chat streams open each choice with the assistant's role."""
        if not self.chat:
            return []
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}]) for i in range(n)]

    def delta_chunks(self, d: pb.SequenceDelta) -> list[dict]:
        # A delta whose tokens add no text yet (a character split across tokens) still gets its
        # chunk, so that continuous usage counts each chunk's tokens against its own choice.
        reason = FINISH_REASON_NAMES[d.finish_reason]
        if not self.chat:
            if not d.text and not d.token_ids and reason is None:
                return []
            return [self._chunk([{"index": d.index, "text": d.text, "logprobs": None, "finish_reason": reason}])]
        out = []
        if d.text or d.token_ids:
            out.append(self._chunk([{"index": d.index, "delta": {"content": d.text}, "logprobs": None,
                                     "finish_reason": None}]))
        if reason is not None:
            out.append(self._chunk([{"index": d.index, "delta": {}, "logprobs": None, "finish_reason": reason}]))
        return out

    def with_usage(self, chunks: list[dict], completion_tokens: int) -> list[dict]:
        """stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far,
        so a client can tell how many tokens each chunk brought."""
        return [{**c, "usage": self.usage(completion_tokens)} for c in chunks]

    def usage_chunk(self, s: pb.Stats) -> dict:
        """stream_options.include_usage: the last chunk, with no choices."""
        return {**self._chunk([]), "usage": self.usage(s.generated_tokens), "bass": stats(s)}


def stats(s: pb.Stats) -> dict:
    rate = s.acceptance_rate
    return {"steps": s.steps, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": rate if math.isfinite(rate) else None, "time_ms": s.time_ms, "queue_ms": s.queue_ms}


def sse(data: dict | str) -> bytes:
    """One server-sent event, as the OpenAI clients parse them."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
