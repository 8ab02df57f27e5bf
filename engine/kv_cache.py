"""A slot-per-sequence KV cache with a fixed capacity.

Each slot holds one sequence's keys and values at positions [0, length). Positions index the
storage directly (as in gpt-fast), so rolling back rejected draft tokens is setting a length,
and forking copies a prefix into a fresh slot. The cache also remembers which token sits at
each position, which lets a worker find where newly committed tokens diverge from the
speculative tokens it cached.
"""

from __future__ import annotations

from collections import deque

import torch

from bass.core.errors import CacheFullError, SequenceTooLongError


class KVCache:
    def __init__(self, *, num_layers: int, num_slots: int, max_seq_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_slots, max_seq_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self._tokens: list[list[int] | None] = [None] * num_slots
        self._free: deque[int] = deque(range(num_slots))

    # -- slots ---------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise CacheFullError(f"KV cache full: all {self.num_slots} slots are in use")
        slot = self._free.popleft()
        self._tokens[slot] = []
        return slot

    def release(self, slot: int) -> None:
        self._check(slot)
        self._tokens[slot] = None
        self._free.append(slot)

    def fork(self, src: int) -> int:
        """A new slot holding a copy of `src`'s cached prefix."""
        self._check(src)
        dst = self.allocate()
        n = len(self._tokens[src])
        if n:
            self.k[:, dst, :n].copy_(self.k[:, src, :n])
            self.v[:, dst, :n].copy_(self.v[:, src, :n])
        self._tokens[dst] = list(self._tokens[src])
        return dst

    # -- contents --------------------------------------------------------------------------
    def length(self, slot: int) -> int:
        self._check(slot)
        return len(self._tokens[slot])

    def tokens(self, slot: int) -> list[int]:
        """The tokens cached in `slot`; the caller must not modify the list."""
        self._check(slot)
        return self._tokens[slot]

    def append(self, slot: int, tokens: list[int]) -> int:
        """Reserve positions for `tokens` (their K/V are written by the forward pass); returns
        the first position."""
        self._check(slot)
        cached = self._tokens[slot]
        start = len(cached)
        if start + len(tokens) > self.max_seq_len:
            raise SequenceTooLongError(
                f"sequence would reach {start + len(tokens)} tokens; the KV cache holds at most "
                f"max_seq_len={self.max_seq_len} per sequence")
        cached.extend(tokens)
        return start

    def append_each(self, slots: list[int], token: int) -> list[int]:
        """append(slot, [token]) for each slot (a step's one input a sequence), all or none:
        their positions. One pass: regular decoding does this for every sequence every step."""
        held, limit, starts = self._tokens, self.max_seq_len, []
        try:
            for slot in slots:
                cached = held[slot] if 0 <= slot < self.num_slots else None
                if cached is None:
                    self._check(slot)  # raises
                if len(cached) >= limit:
                    self.append(slot, [token])  # raises SequenceTooLongError
                starts.append(len(cached))
                cached.append(token)
        except (ValueError, SequenceTooLongError):
            for slot, start in zip(slots, starts):
                del held[slot][start:]
            raise
        return starts

    def settle_each(self, slots: list[int], positions: list[int], tokens: list[int]) -> None:
        """settle(slot, position, [token]) for each triple, in one pass."""
        held = self._tokens
        for slot, position, token in zip(slots, positions, tokens):
            cached = held[slot] if 0 <= slot < self.num_slots else None
            if cached is None or not 0 <= position < len(cached):
                self.settle(slot, position, [token])  # raises
            cached[position] = token

    def settle(self, slot: int, start: int, tokens: list[int]) -> None:
        """Record the values of tokens that were appended as placeholders (their ids lived on
        the device when they ran) at positions start.. ."""
        self._check(slot)
        cached = self._tokens[slot]
        if start < 0 or start + len(tokens) > len(cached):
            raise ValueError(f"cannot settle positions {start}..{start + len(tokens)} of slot {slot} "
                             f"holding {len(cached)}")
        cached[start:start + len(tokens)] = tokens

    def truncate(self, slot: int, length: int) -> None:
        """Forget positions >= length (rollback). Storage is overwritten by later appends."""
        self._check(slot)
        cached = self._tokens[slot]
        if not 0 <= length <= len(cached):
            raise ValueError(f"cannot truncate slot {slot} of length {len(cached)} to {length}")
        del cached[length:]

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or self._tokens[slot] is None:
            raise ValueError(f"KV cache slot {slot} is not allocated")
