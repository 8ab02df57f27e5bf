"""A sequence's text, grown as tokens commit, at a cost that does not grow with its length.

Decoding a sequence's whole output after every step (to look for stop strings and to stream)
costs O(length) per step and O(length^2) per sequence: for 64 sequences of 2,000 tokens that
is more coordinator time per step than a GPU step takes. Here text is decoded from a short
window instead: the tokens not yet turned into text, preceded by the tokens of the last piece
of text that was, decoded again as context. Tokenizers whose text for a token depends on its
neighbour (a SentencePiece word-start space, byte-level tokens that split a UTF-8 character)
then see the same neighbours as in a full decode, and the new text is what the window's decode
adds to the context's decode.

Text becomes *stable* once it ends on a complete character; a window whose decode ends in
U+FFFD (an incomplete UTF-8 sequence) waits for the tokens that complete it. Stable text is
what streaming sends and what the stop-string search has already searched. Nothing is decoded
until someone asks (`stable`, `pending`), so a request without stop strings that does not
stream decodes its text once, when it finishes.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


class IncrementalText:
    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._context_start = 0  # ids[context_start:stable_end] are decoded again as context
        self._stable_end = 0  # ids whose text is in _stable
        self._context_len: int | None = 0  # length of the context's own decode (None: not yet known)
        self._stable = ""
        # The last window decoded: the stop-string check decodes the window with a step's new
        # tokens, which are then taken; advancing over them reuses that decode.
        self._last_window: tuple[int, list[int], str] | None = None

    def extend(self, ids: Sequence[int]) -> None:
        """Take tokens (their text is decoded when asked for)."""
        self._ids.extend(ids)

    @property
    def stable(self) -> str:
        """The text so far up to its last complete character; it only ever grows."""
        if self._stable_end < len(self._ids):
            new = self.pending()
            if new and not new.endswith(REPLACEMENT_CHAR):
                self._stable += new
                self._context_start, self._stable_end = self._stable_end, len(self._ids)
                self._context_len = None
        return self._stable

    def pending(self, extra: Sequence[int] = ()) -> str:
        """The text after the stable text of the tokens taken so far plus `extra` (which are
        not taken). It may end in U+FFFD while a character is incomplete."""
        window = self._ids[self._context_start:] + list(extra)
        last = self._last_window
        if last is not None and last[0] == self._context_start and last[1] == window:
            decoded = last[2]
        else:
            decoded = self._decode(window)
            self._last_window = (self._context_start, window, decoded)
        if self._context_len is None:
            self._context_len = len(self._decode(self._ids[self._context_start:self._stable_end]))
        return decoded[self._context_len:]

    def text(self) -> str:
        """All the text so far, decoded at once (once per sequence, when it is returned).

        It equals `stable + pending()` except where a tokenizer revises text that was already
        stable: Llama-style byte fallback shows a run of byte tokens as U+FFFD characters
        while the run ends in an incomplete character, and for good if it never completes.
        The full decode is the one answer."""
        return self._decode(self._ids)
