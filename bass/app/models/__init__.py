"""Model weights for BASS: the pinned default pair, GGUF fetching and GGUF -> HF conversion.

Public entry points (imported lazily, so `import bass.app.models` does not pull in torch):
    convert_gguf(gguf_path, out_dir, dtype="bfloat16", progress=True, *, overwrite=False) -> Path
    fetch_model_pair(models_dir=None, cache_dir=None, progress=True, *, dtype=..., keep_gguf=False)
    default_model_dirs(models_dir=None) -> (draft_dir, target_dir)
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import GGUFConversionError, ModelFetchError, ModelSetupError, NotEnoughDiskSpaceError

_LAZY = {
    "convert_gguf": "gguf_convert",
    "fetch_model_pair": "fetch",
    "default_model_dirs": "fetch",
    "default_models_dir": "fetch",
    "FetchResult": "fetch",
}

__all__ = [
    "GGUFConversionError",
    "ModelFetchError",
    "ModelSetupError",
    "NotEnoughDiskSpaceError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
