"""Text <-> token ids for the coordinator (the models' shared tokenizer)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Protocol, Sequence


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...


class HFCodec:
    """A Hugging Face tokenizer loaded from a local model directory (never from a hub)."""

    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    @cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes of text any one token decodes to (special tokens included, since
        a prompt may spell them). A prompt of B bytes therefore needs at least
        B / max_token_bytes tokens, which bounds its length before tokenizing it. A token that
        is part of a character decodes to U+FFFD (3 bytes), which only loosens the bound."""
        pieces = self._tok.batch_decode([[i] for i in range(len(self._tok))])
        return max(1, max(len(p.encode("utf-8")) for p in pieces))


class IdsOnlyCodec:
    """For models without tokenizer files: prompts must be token ids and text is empty."""

    def encode(self, text: str) -> list[int]:
        from bass.core.errors import InvalidRequestError

        raise InvalidRequestError("prompt", "this model has no tokenizer; send prompt_ids")

    def decode(self, token_ids: Sequence[int]) -> str:
        return ""


def load_codec(model_dir: Path) -> Codec:
    model_dir = Path(model_dir)
    if any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return HFCodec(model_dir)
    return IdsOnlyCodec()
