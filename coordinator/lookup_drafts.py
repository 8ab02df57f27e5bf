"""Stand-ins that may be right: a sequence's own earlier text, continued from where its last tokens recur.

A streamed step verifies the same number of positions for every sequence, so that the target's
CUDA graphs replay (coordinator/streamed_step.py). Where the draft has fewer tokens to offer (it
is starting over after a contradiction, or has not caught up yet), the other positions used to
verify the sequence's last token repeated, which the target rarely accepts. Code repeats
itself: identifiers from the prompt, a call pattern, a closing bracket after the same opener.
So the positions the draft leaves empty take what followed the most recent earlier occurrence
of the sequence's last n tokens (prompt lookup decoding; Saxena, 2023), longest n first. They
cost no GPU time (the positions are verified anyway) and nothing in correctness: the target
decides every position by its own race, whatever token stands there.

On HumanEval's canonical solutions (the bundled tokenizer, every position, n = 3..1), such a
lookup has 0.45-0.49 of its 4-6 tokens accepted on average (bench/cpu/lookup_stand_ins.py; journal
2026-11-27-h200x2-in-process-target.md).
"""

from __future__ import annotations


class NgramIndex:
    """Where each n-gram (1 <= n <= longest) of a growing token list last occurred with a token
    after it. Kept up to date as tokens are appended (`extend`), so a lookup costs a dict read
    per n, not a scan of the context."""

    def __init__(self, longest: int):
        if longest < 1:
            raise ValueError(f"n-grams of >= 1 token, got {longest}")
        self.longest = longest
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its last occurrence

    def extend(self, tokens) -> None:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        ts, index = self.tokens, self._next
        # An n-gram is recorded once a token follows it: the one that ends the list is not, so a
        # lookup of the list's own last tokens finds an earlier occurrence.
        for after in range(max(1, start), len(ts)):
            for n in range(1, min(self.longest, after) + 1):
                index[tuple(ts[after - n:after])] = after

    def continuation(self, suffix, count: int) -> tuple[int, ...]:
        """Up to `count` tokens that followed the most recent occurrence of the longest of
        `suffix`'s last n tokens to occur (suffix: the indexed tokens, maybe with more after
        them); () where none occurs."""
        return self.match(suffix, count)[1] if count > 0 else ()

    def match(self, suffix, count: int) -> tuple[int, tuple[int, ...]]:
        """`continuation`, with the n it matched (0 where none occurs)."""
        for n in range(min(self.longest, len(suffix)), 0, -1):
            after = self._next.get(tuple(suffix[-n:]))
            if after is not None:
                return n, tuple(self.tokens[after:after + count])
        return 0, ()
