"""Errors as OpenAI-style JSON bodies ({"error": {"message", "type", "param", "code"}}) with the
HTTP status that matches: 400 for bad parameters (naming the field), 429 for a full queue, 503
while the target is down. The coordinator's gRPC status codes map one to one."""

from __future__ import annotations

import grpc

# gRPC status -> (HTTP status, OpenAI error type)
STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
}


class ApiError(Exception):
    """An answer with an error body. `param` names the request field at fault, as the client sent it."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(param: str, message: str) -> ApiError:
    """400 naming `param`; the message starts with it, as the gRPC API's messages do."""
    return ApiError(400, f"{param}: {message}", param=param)


def from_grpc(error: grpc.RpcError, field_names: dict[str, str]) -> ApiError:
    """The coordinator's error as the HTTP front answers it. INVALID_ARGUMENT's message starts with
    the bad field's gRPC name ("max_new_tokens: ..."); `field_names` gives the request's own name
    for it (max_tokens), which becomes `param` and replaces the name in the message."""
    code, details = error.code(), error.details() or ""
    status, kind = STATUS.get(code, (500, "internal_error"))
    param = None
    if status == 400:
        head, sep, rest = details.partition(": ")
        if sep and " " not in head:
            param = field_names.get(head, head)
            details = f"{param}: {rest}"
    return ApiError(status, details or code.name.lower(), type=kind, param=param, code=code.name.lower())
