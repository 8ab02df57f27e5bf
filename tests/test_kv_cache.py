import pytest
import torch

from bass.core.errors import CacheFullError, SequenceTooLongError
from bass.engine.kv_cache import KVCache


def make_cache(slots=3, max_len=8):
    return KVCache(num_layers=2, num_slots=slots, max_seq_len=max_len, num_kv_heads=1, head_dim=2,
                   dtype=torch.float32, device="cpu")


def test_append_truncate_is_a_length_change():
    cache = make_cache()
    s = cache.allocate()
    assert cache.append(s, [10, 11, 12]) == 0
    assert cache.append(s, [13, 14]) == 3
    cache.k[:, s, :5] = 7.0
    cache.truncate(s, 2)
    assert cache.length(s) == 2 and cache.tokens(s) == [10, 11]
    assert cache.append(s, [20]) == 2  # the next append reuses rolled-back positions
    with pytest.raises(ValueError):
        cache.truncate(s, 5)


def test_fork_copies_prefix_and_is_independent():
    cache = make_cache()
    a = cache.allocate()
    cache.append(a, [1, 2, 3])
    cache.k[:, a, :3] = torch.arange(3.0)[None, :, None, None]
    cache.v[:, a, :3] = 5.0
    b = cache.fork(a)
    assert b != a and cache.tokens(b) == [1, 2, 3]
    assert torch.equal(cache.k[:, b, :3], cache.k[:, a, :3]) and torch.equal(cache.v[:, b, :3], cache.v[:, a, :3])
    cache.append(b, [4])
    cache.truncate(a, 1)
    assert cache.tokens(a) == [1] and cache.tokens(b) == [1, 2, 3, 4]


def test_full_cache_raises_and_release_frees():
    cache = make_cache(slots=2)
    a, b = cache.allocate(), cache.allocate()
    assert cache.free_slots == 0
    with pytest.raises(CacheFullError, match="all 2 slots"):
        cache.allocate()
    with pytest.raises(CacheFullError):
        cache.fork(a)
    cache.release(a)
    assert cache.free_slots == 1
    c = cache.allocate()
    assert c == a and cache.length(c) == 0  # a reused slot starts empty
    with pytest.raises(ValueError, match="not allocated"):
        cache.release(99)
    cache.release(b)
    with pytest.raises(ValueError, match="not allocated"):
        cache.length(b)


def test_sequence_too_long_is_refused_without_side_effects():
    cache = make_cache(max_len=4)
    s = cache.allocate()
    cache.append(s, [1, 2, 3])
    with pytest.raises(SequenceTooLongError, match="max_seq_len=4"):
        cache.append(s, [4, 5])
    assert cache.tokens(s) == [1, 2, 3]


def test_one_token_appended_and_settled_in_many_slots_at_once():
    """append_each / settle_each: what append and settle do slot by slot, all or nothing."""
    cache = make_cache(slots=4, max_len=4)
    a, b, c = cache.allocate(), cache.allocate(), cache.allocate()
    cache.append(a, [1, 2])
    cache.append(b, [3])
    assert cache.append_each([a, b, c], -1) == [2, 1, 0]
    assert cache.tokens(a) == [1, 2, -1] and cache.tokens(b) == [3, -1] and cache.tokens(c) == [-1]
    cache.settle_each([a, c], [2, 0], [7, 8])
    assert cache.tokens(a) == [1, 2, 7] and cache.tokens(c) == [8]
    with pytest.raises(ValueError):
        cache.settle_each([b], [2], [9])  # past the slot's length
    cache.append(a, [4])  # a is full now
    with pytest.raises(SequenceTooLongError):
        cache.append_each([b, a], -1)
    with pytest.raises(ValueError, match="not allocated"):
        cache.append_each([c, 3], -1)
    assert cache.tokens(b) == [3, -1] and cache.tokens(c) == [8]  # nothing of a refused call stays
