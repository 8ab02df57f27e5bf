"""What a draft stream drafted past each sequence's committed tokens, as far as the coordinator knows.

A draft stream (draft_service/stream.py) drafts ahead on its own and its tokens arrive while the
target verifies; the target's commits reach the draft later still. So some tokens that arrive
were drafted from a prefix the target has since contradicted. They are told apart by content and
by epoch: a token at a position the target already committed must equal the committed token, else
its chain is dead (every later token of that epoch too, until the draft's next epoch arrives);
a commit that disagrees with the tokens held kills their chain the same way. What survives is,
per sequence, a run of drafts that continues the committed tokens exactly: the next block to verify.
Where that run is shorter than a block, `lookup` gives the rest of the block from the sequence's
own earlier text (coordinator/lookup_drafts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bass.coordinator.lookup_drafts import NgramIndex
from bass.core.config import LOOKUP_WINDOW
from bass.core.worker_api import StreamDrafts


@dataclass
class _Sequence:
    committed: list[int]  # prompt and every committed token
    drafts: list[int] = field(default_factory=list)  # continue `committed`
    epoch: int = 0  # of `drafts`' chain
    dead_below: int = 0  # tokens of epochs below this are from a dead chain
    # Over `committed`: built at the first lookup from its last LOOKUP_WINDOW tokens (at ~0.6 us a
    # token, ~2.5 ms for 16 sequences' first lookups), caught up with what was committed since.
    index: NgramIndex | None = None
    indexed: int = 0  # tokens of `committed` the index has seen (or skipped)

    def deliver(self, d: StreamDrafts) -> int:
        """Take what arrived; returns how many of its tokens were kept as drafts."""
        if d.epoch < max(self.epoch, self.dead_below):
            return 0
        if d.epoch > self.epoch:  # the draft started over from the committed tokens
            self.epoch, self.drafts = d.epoch, []
        kept = 0
        for i, token in enumerate(d.tokens):
            position = d.position + i
            if position < len(self.committed):
                if self.committed[position] != token:
                    self._kill()
                    return kept
                continue
            if position != len(self.committed) + len(self.drafts):
                self._kill()  # a gap: not a continuation of what is held (never expected)
                return kept
            self.drafts.append(token)
            kept += 1
        return kept

    def commit(self, tokens: list[int]) -> None:
        n = min(len(self.drafts), len(tokens))
        if self.drafts[:n] == tokens[:n]:
            del self.drafts[:n]
        else:
            self._kill()
        self.committed.extend(tokens)

    def lookup(self, block: tuple[int, ...], count: int, longest: int) -> tuple[int, ...]:
        # Indexed here, not at each commit: a sequence whose drafts fill its blocks pays nothing.
        if self.index is None:
            self.index = NgramIndex(longest)
            self.indexed = max(0, len(self.committed) - LOOKUP_WINDOW)
        self.index.extend(self.committed[self.indexed:])
        self.indexed = len(self.committed)
        return self.index.continuation(self.committed[-longest:] + list(block), count)

    def _kill(self) -> None:
        self.drafts = []
        self.dead_below = self.epoch + 1


class DraftsAhead:
    """Per sequence followed by a draft stream, the drafts that continue its committed tokens."""

    def __init__(self, lookup: int = 0):
        """lookup: the longest n-gram `lookup` matches (0: it gives nothing)."""
        self._seqs: dict[int, _Sequence] = {}
        self.longest = lookup

    def follow(self, seq_id: int, committed: list[int]) -> None:
        """Start holding drafts for a sequence whose committed tokens (prompt included) are these."""
        self._seqs[seq_id] = _Sequence(list(committed))

    def forget(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def clear(self) -> None:
        self._seqs.clear()

    def follows(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def deliver(self, drafts: list[StreamDrafts]) -> tuple[int, int]:
        """Take what arrived: (tokens that arrived, tokens kept as drafts)."""
        arrived = kept = 0
        for d in drafts:
            arrived += len(d.tokens)
            seq = self._seqs.get(d.seq_id)
            if seq is not None:
                kept += seq.deliver(d)
        return arrived, kept

    def commit(self, seq_id: int, tokens: list[int]) -> None:
        seq = self._seqs.get(seq_id)
        if seq is not None:
            seq.commit(tokens)

    def held(self, seq_id: int) -> int:
        seq = self._seqs.get(seq_id)
        return len(seq.drafts) if seq is not None else 0

    def block(self, seq_id: int, most: int) -> tuple[int, ...]:
        """The next block to verify: up to `most` drafts (they stay held until committed)."""
        seq = self._seqs.get(seq_id)
        return tuple(seq.drafts[:most]) if seq is not None else ()

    def lookup(self, seq_id: int, block: tuple[int, ...], count: int) -> tuple[int, ...]:
        """Up to `count` tokens to verify after `block` (the drafts it holds, or fewer) where the
        draft has none: what followed the last recurrence of the sequence's latest tokens."""
        seq = self._seqs.get(seq_id)
        if seq is None or not self.longest or count <= 0:
            return ()
        return seq.lookup(block, count, self.longest)
