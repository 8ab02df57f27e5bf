"""An OpenAI request body to the options of a bass.v1 GenerateRequest.

Supported: `prompt` (text or token ids; a list of one), `messages` (chat), `max_tokens`
(`max_completion_tokens` for chat), `temperature`, `top_p`, `n`, `stop`, `seed`, `stream`,
`stream_options.include_usage` (and vLLM's `continuous_usage_stats`), `user` (ignored), `model` (any name; answers carry the served
one); vLLM's extensions `top_k` (-1 or 0 = off), `ignore_eos`, `stop_token_ids`; and ours under
`bass`: `time_budget_ms`, `speculate` (false = regular decoding for this request).

Refused with 400 naming the field, because the output would not be what the client asked for:
`logprobs` / `top_logprobs`, `echo`, `suffix`, `best_of` other than n, non-zero `presence_penalty` /
`frequency_penalty`, `repetition_penalty` other than 1, `logit_bias`, `min_tokens`, `tools` /
`functions`, a `response_format` other than text, several prompts in one request. Other fields
are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bass.app.http.errors import bad_param

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 128  # the gRPC API's default (OpenAI's: as long as the context allows)
BASS_EXTENSIONS = ("time_budget_ms", "speculate")
MAX_SEED = 2 ** 64
UINT32_MAX = 2 ** 32 - 1  # n, max_tokens, top_k, time_budget_ms and token ids are uint32 on the wire


@dataclass
class Plan:
    """What one request asks for: its prompt (text, token ids or chat messages) and the options of
    bass.app.client.build_request."""

    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    options: dict = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage on every chunk
    # the coordinator's field names -> this request's (for error messages)
    field_names: dict[str, str] = field(default_factory=dict)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(body: dict, name: str, default: int | None, *, minimum: int | None = None,
         maximum: int | None = UINT32_MAX, where: str | None = None):
    v = body.get(name)
    where = where or name
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise bad_param(where, f"must be an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise bad_param(where, f"must be an integer >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise bad_param(where, f"must be an integer <= {maximum}, got {v}")
    return v


def _number(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_param(name, f"must be a number, got {v!r}")
    return float(v)


def _bool(body: dict, name: str, default: bool, where: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_param(where or name, f"must be true or false, got {v!r}")
    return v


def _refuse_unsupported(body: dict, chat: bool) -> None:
    def refuse(name: str, why: str) -> None:
        raise bad_param(name, f"is not supported ({why})")

    if chat:
        if body.get("logprobs"):
            refuse("logprobs", "this server returns no log probabilities")
        if body.get("top_logprobs") is not None:
            refuse("top_logprobs", "this server returns no log probabilities")
        if body.get("tools") or body.get("functions"):
            refuse("tools" if body.get("tools") else "functions", "no tool calling")
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in (None, "text")):
            refuse("response_format", "only plain text")
    else:
        if body.get("logprobs") is not None:
            refuse("logprobs", "this server returns no log probabilities")
        if body.get("echo"):
            refuse("echo", "the prompt is not returned")
        if body.get("suffix") is not None:
            refuse("suffix", "no insertion")
        best_of = body.get("best_of")
        if best_of is not None and best_of != (body.get("n") or 1):
            refuse("best_of", "only best_of = n")
    for name in ("presence_penalty", "frequency_penalty", "min_tokens"):
        if body.get(name):
            refuse(name, "only 0")
    if body.get("repetition_penalty") not in (None, 1, 1.0):
        refuse("repetition_penalty", "only 1")
    if body.get("logit_bias"):
        refuse("logit_bias", "no logit bias")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise bad_param("stop", "must be a string or a list of strings")


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_param("prompt", "must not be empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(not 0 <= t <= UINT32_MAX for t in prompt):
            raise bad_param("prompt", "token ids must be non-negative integers below 2**32")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_param("prompt", "one prompt per request (send several prompts as separate requests)")
    if prompt is None:
        raise bad_param("prompt", "is required")
    raise bad_param("prompt", "must be a non-empty string or a non-empty list of token ids")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_param("messages", "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_param("messages", f"message {i} must be an object with a role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad_param("messages", f"message {i}: only text content parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise bad_param("messages", f"message {i}: content must be a string or a list of text parts")
        out.append({**{k: v for k, v in m.items() if k in ("role", "name")}, "content": content})
    return out


def parse(body: Any, *, chat: bool) -> Plan:
    """The Plan of a /v1/completions (chat=False) or /v1/chat/completions body; 400 naming the field
    for anything malformed or unsupported."""
    if not isinstance(body, dict):
        raise bad_param("body", "must be a JSON object")
    _refuse_unsupported(body, chat)
    plan = Plan()
    if chat:
        plan.messages = _messages(body)
        max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        default_max = CHAT_DEFAULT_MAX_TOKENS
    else:
        plan.prompt = _prompt(body)
        max_name, default_max = "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS
    ext = body.get("bass") or {}
    if not isinstance(ext, dict):
        raise bad_param("bass", "must be an object")
    for name in ext:
        if name not in BASS_EXTENSIONS + ("top_k", "ignore_eos", "stop_token_ids"):
            raise bad_param(f"bass.{name}", f"unknown extension (known: {', '.join(BASS_EXTENSIONS)})")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:  # checked here: 0 means "off" on the wire
        raise bad_param("top_p", f"must be in (0, 1], got {top_p!r}")
    top_k = _int({**body, **ext}, "top_k", 0, minimum=-1)
    seed = _int(body, "seed", None, maximum=None)
    if seed is not None and not 0 <= seed < MAX_SEED:
        raise bad_param("seed", f"must be an integer in [0, 2**64), got {seed}")
    stop_ids = {**body, **ext}.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(_is_int(t) and 0 <= t <= UINT32_MAX for t in stop_ids)):
        raise bad_param("stop_token_ids", "must be a list of non-negative token ids")
    plan.options = dict(
        n=_int(body, "n", 1, minimum=1),
        max_new_tokens=_int(body, max_name, default_max, minimum=1),
        temperature=_number(body, "temperature", 1.0),
        top_p=top_p, top_k=max(top_k, 0), seed=seed, stop=_stop(body), stop_token_ids=stop_ids,
        ignore_eos=_bool({**body, **ext}, "ignore_eos", False),
        time_budget_ms=_int(ext, "time_budget_ms", 0, minimum=0, where="bass.time_budget_ms"),
        speculate=_bool(ext, "speculate", True, where="bass.speculate"),
    )
    plan.stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_param("stream_options", "must be an object")
        plan.include_usage = _bool(options, "include_usage", False, where="stream_options.include_usage")
        plan.continuous_usage = _bool(options, "continuous_usage_stats", False,
                                      where="stream_options.continuous_usage_stats")
    prompt_name = "messages" if chat else "prompt"
    plan.field_names = {"max_new_tokens": max_name, "prompt": prompt_name, "prompt_ids": prompt_name,
                        "prompt_token_ids": prompt_name, "time_budget_ms": "bass.time_budget_ms"}
    return plan
