"""Exception types for getting model weights onto disk.

Every failure the fetch/convert path can hit on purpose is one of these, so the CLI can print
the message as a one-line error instead of a traceback.
"""


class ModelSetupError(Exception):
    """Base class: a model could not be fetched or converted; the message says why."""


class GGUFConversionError(ModelSetupError):
    """The GGUF file uses something the converter does not support, or is malformed."""


class ModelFetchError(ModelSetupError):
    """Downloading, joining or verifying the pinned chunk wheels failed."""


class NotEnoughDiskSpaceError(ModelSetupError):
    """A step was refused up front because the target filesystem is too full."""
