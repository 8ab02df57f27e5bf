"""Prompts to token ids, with the models' tokenizer: text as the coordinator would tokenize it
(so the same text gives the same tokens over HTTP and over gRPC), chat messages through the
tokenizer's chat template (or the one the front was given) with the assistant's turn opened."""

from __future__ import annotations

import threading
from pathlib import Path

from bass.app.http.errors import bad_param


class Prompts:
    def __init__(self, tokenizer_dir: Path | None, chat_template: Path | None = None):
        self._tok = None
        if tokenizer_dir is not None and any((Path(tokenizer_dir) / f).is_file()
                                             for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        self._template = Path(chat_template).read_text() if chat_template is not None else None
        self._lock = threading.Lock()  # a fast tokenizer is not safe to call from several threads at once

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None or bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Exactly the coordinator's tokenization of a text prompt (coordinator/tokenizer.py)."""
        if self._tok is None:
            raise bad_param("prompt", "this model has no tokenizer; send the prompt as token ids")
        with self._lock:
            return list(self._tok.encode(text))

    def render_chat(self, messages: list[dict]) -> list[int]:
        if self._tok is None:
            raise bad_param("messages", "this model has no tokenizer, so no chat; use /v1/completions with token ids")
        if not self.has_chat_template:
            raise bad_param("messages", "the model's tokenizer has no chat template: start the front with one "
                                        "([http] chat_template = FILE, or --chat-template) or use /v1/completions")
        from jinja2 import TemplateError

        try:
            with self._lock:
                text = self._tok.apply_chat_template(messages, chat_template=self._template, tokenize=False,
                                                     add_generation_prompt=True)
                # The template writes any BOS itself: add no special tokens on top.
                return list(self._tok.encode(text, add_special_tokens=False))
        except (TemplateError, ValueError, TypeError, KeyError) as e:
            raise bad_param("messages", f"the chat template refused them: {e}") from None
