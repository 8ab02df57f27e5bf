"""Errors a caller can act on. Each maps to one gRPC status code at the service edge."""


class BassError(Exception):
    """Base class for errors raised on purpose by this package."""


class InvalidRequestError(BassError, ValueError):
    """A request or config field has a bad value (maps to INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class CapacityError(BassError):
    """A fixed capacity is exhausted; the caller may queue and retry (maps to RESOURCE_EXHAUSTED)."""


class CacheFullError(CapacityError):
    """No free KV-cache slot for a new sequence."""


class SequenceTooLongError(CapacityError):
    """A sequence would grow past the KV cache's max_seq_len."""


class UnknownSequenceError(BassError, KeyError):
    """A worker was asked about a sequence id it does not hold (maps to NOT_FOUND)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown sequence"


class PreconditionError(BassError):
    """A call the worker's state does not allow (maps to FAILED_PRECONDITION)."""


class WorkerUnavailableError(BassError):
    """A model worker cannot be reached or failed mid-call (maps to UNAVAILABLE)."""


class RequestCancelled(BassError):
    """The client cancelled the call or its deadline passed (the coordinator frees its slots)."""


class ForwardedError(BassError):
    """A status another server answered, passed on unchanged by a proxy (the router): `code` is
    the gRPC status code's name (e.g. "INVALID_ARGUMENT"), the message its details."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
