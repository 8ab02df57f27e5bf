"""Cutting a sequence exactly where it must stop, even when a step commits several tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

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


def check_stop(output: Sequence[int], new_tokens: Sequence[int], criteria: StopCriteria,
               decode: Callable[[Sequence[int]], str]) -> StopDecision:
    """Decide how many of `new_tokens` (committed this step) a sequence keeps.

    Tokens are taken one by one: a stop token id is kept and ends the sequence, reaching
    max_new_tokens ends it, and the first token whose text completes a stop string ends it
    (the text is cut before the stop string). Nothing after the first stop is kept.
    """
    keep, reason = len(new_tokens), None
    room = criteria.max_new_tokens - len(output)
    for i, t in enumerate(new_tokens):
        if t in criteria.stop_token_ids:
            keep, reason = i + 1, FinishReason.STOP
            break
        if i + 1 >= room:
            keep, reason = i + 1, FinishReason.LENGTH
            break
    if criteria.stop_strings:
        hit = _first_stop_string(list(output), list(new_tokens[:keep]), criteria.stop_strings, decode)
        if hit is not None:
            return StopDecision(keep=hit[0], reason=FinishReason.STOP, text_end=hit[1])
    return StopDecision(keep=keep, reason=reason)


def _first_stop_string(output: list[int], new: list[int], stops: tuple[str, ...],
                       decode: Callable[[Sequence[int]], str]) -> tuple[int, int] | None:
    """(tokens to keep, text cut position) for the earliest stop string completed by `new`."""
    if not new:
        return None
    old_len = len(decode(output))
    longest = max(len(s) for s in stops)
    # A stop string completed now must end in the new text; decoding can also revise the last
    # few characters of the old text (partial UTF-8), so look a little further back.
    search_from = max(0, old_len - longest - 4)
    if _find(decode(output + new), stops, search_from) is None:
        return None
    for j in range(1, len(new) + 1):
        cut = _find(decode(output + new[:j]), stops, search_from)
        if cut is not None:
            return j, cut
    return None  # pragma: no cover - the full text matched, so some prefix does


def _find(text: str, stops: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None
