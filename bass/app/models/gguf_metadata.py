"""Plain-Python view of a GGUF file's key/value metadata.

gguf's reader exposes each field as raw numpy parts; everything downstream (config, tokenizer)
only wants ints, floats, strings and lists, keyed by llama.cpp's key names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from .errors import GGUFConversionError

# llama.cpp's token kinds (gguf.TokenType), spelled out here because they drive decisions in
# two modules: which tokens are special, which are padding to drop.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6


class GGUFMetadata:
    """Dictionary-like access to metadata, with errors that name the missing key."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.arch: str = self.require("general.architecture")

    @classmethod
    def from_reader(cls, reader: GGUFReader) -> "GGUFMetadata":
        values = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):  # file header bookkeeping, not model metadata
                continue
            value = field.contents()
            if field.types == [GGUFValueType.FLOAT32]:
                # Stored as float32; keep the shortest decimal that round-trips in float32, so
                # an epsilon of 1e-6 is written to config.json as 1e-06, not 9.99999997e-07.
                value = float(str(np.float32(value)))
            values[key] = value
        return cls(values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.values:
            raise GGUFConversionError(f"GGUF metadata lacks required key {key!r}")
        return self.values[key]

    def arch_get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key, e.g. arch_get('block_count') reads 'qwen2.block_count'."""
        return self.values.get(f"{self.arch}.{key}", default)

    def arch_require(self, key: str) -> Any:
        return self.require(f"{self.arch}.{key}")

    @property
    def tokens(self) -> list[str]:
        return self.require("tokenizer.ggml.tokens")

    @property
    def token_types(self) -> list[int]:
        # Files without types treat every token as ordinary text.
        return self.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(self.tokens)

    def token_text(self, key: str) -> str | None:
        """Text of the token whose id is stored under `tokenizer.ggml.<key>`, if any."""
        token_id = self.get(f"tokenizer.ggml.{key}")
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]
