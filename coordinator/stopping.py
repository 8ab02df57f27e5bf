"""Cutting a sequence exactly where it must stop, even when a step commits several tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bass.coordinator.incremental_text import IncrementalText
from bass.coordinator.requests import FinishReason


@dataclass(frozen=True)
class StopCriteria:
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class StopDecision:
    keep: int  # how many of the offered tokens to append
    reason: FinishReason | None
    text_end: int | None = None  # for a stop string: where the text is cut
    ends_with_stop_id: bool = False  # the last kept token is a stop token id (it has no text)

    def text_tokens(self, tokens: Sequence[int]) -> Sequence[int]:
        """The kept tokens that become text: a stop token id ends the sequence but is not shown."""
        return tokens[:self.keep - 1] if self.ends_with_stop_id else tokens[:self.keep]


def check_stop(generated: int, text: IncrementalText, new_tokens: Sequence[int],
               criteria: StopCriteria) -> StopDecision:
    """Decide how many of `new_tokens` (committed this step) a sequence that has `generated`
    tokens and the text `text` keeps.

    Tokens are taken one by one: a stop token id is kept and ends the sequence, reaching
    max_new_tokens ends it, and the first token whose text completes a stop string ends it
    (the text is cut before the stop string). Nothing after the first stop is kept.
    """
    keep, reason, stop_id = len(new_tokens), None, False
    room = criteria.max_new_tokens - generated
    for i, t in enumerate(new_tokens):
        if t in criteria.stop_token_ids:
            keep, reason, stop_id = i + 1, FinishReason.STOP, True
            break
        if i + 1 >= room:
            keep, reason = i + 1, FinishReason.LENGTH
            break
    decision = StopDecision(keep=keep, reason=reason, ends_with_stop_id=stop_id)
    if criteria.stop_strings:
        hit = _first_stop_string(text, list(decision.text_tokens(new_tokens)), criteria.stop_strings)
        if hit is not None:
            return StopDecision(keep=hit[0], reason=FinishReason.STOP, text_end=hit[1])
    return decision


def _first_stop_string(text: IncrementalText, new: list[int], stops: tuple[str, ...]) -> tuple[int, int] | None:
    """(tokens to keep, text cut position) for the earliest stop string completed by `new`."""
    if not new:
        return None
    # A stop string completed now ends after the stable text, so at most its first
    # len - 1 characters lie in the stable text (which earlier steps searched already).
    lookback = max(len(s) for s in stops) - 1
    before = text.stable[-lookback:] if lookback else ""
    base = len(text.stable) - len(before)
    if _find(before + text.pending(new), stops) is None:
        return None
    for j in range(1, len(new) + 1):
        cut = _find(before + text.pending(new[:j]), stops)
        if cut is not None:
            return j, base + cut
    return None  # pragma: no cover - the full text matched, so some prefix does


def _find(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
