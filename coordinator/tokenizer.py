"""Text <-> token ids for the coordinator (the models' shared tokenizer)."""

from __future__ import annotations

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


class IdsOnlyCodec:
    """For models without tokenizer files: prompts must be token ids and text is empty."""

    def encode(self, text: str) -> list[int]:
        from bass.errors import InvalidRequestError

        raise InvalidRequestError("prompt", "this model has no tokenizer; send prompt_ids")

    def decode(self, token_ids: Sequence[int]) -> str:
        return ""


def load_codec(model_dir: Path) -> Codec:
    model_dir = Path(model_dir)
    if any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return HFCodec(model_dir)
    return IdsOnlyCodec()
