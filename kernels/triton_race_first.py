"""The sampled race first, its top-k / top-p cut only where needed: a step's tokens in nine
launches with no top-k selection over the vocabulary and no host sync (engine/sampling.
race_unsynced and draft_race on a GPU; the exact path's kernels are in triton_sampling.py).

A sampled row's token is the winner of the race over the tokens its top-k / top-p cut keeps.
Run over *every* token, the race's winner w is that token whenever the cut keeps w, since the
kept tokens are a subset holding it; and the cut keeps w exactly when the tokens strictly more
likely than w hold less than top_p of the mass (and, with top_k, number fewer than top_k). For
a code model's distribution w is nearly always the most likely token or close to it, so one
pass over the row (the race, and the log-sum-exp beside it) and, where w is not the most likely
token, a second (the mass above w) decide it, with no top-k selection over 152k tokens.

Where the cut does not keep w, it lies above w, and every token it keeps is among those above
w: the second pass gathers them (up to _ABOVE_BUFFER) for one program per row to sort, cut and
race again over. A winner from the long tail has thousands of tokens above it, though, and a
top-k with top-p may keep tokens below w. Those rows alone take two more passes: one measures
the mass and count above a few thresholds under the most likely token (_BANDS), the next
gathers the tokens above the highest threshold that is sure to hold every token the cut keeps
(top-p's mass, or top_k tokens) and fits the buffer. A row with no such threshold (a nucleus of
hundreds of tokens, as a flat distribution at T >= 1 has, or a top_k beyond the buffer) is
settled by one program that races again above each winner the cut drops, until the mass above
the new winner says the cut keeps it (_exact_cut_kernel: two passes over the row a round,
1 / top_p rounds on average, ~0.25 ms a round on an H100). That is slower per row than the
buffer, but on the device, where a host redo would cost a sync and, in regular decoding, a
repair of the step run ahead; so every row is decided on the device. A draft's proposal skips
it (exact=False): such a row proposes its race winner, which the target may reject, as a
proposal need only be close. Every row's result depends on that row alone: the gathering's
order, which atomics decide, changes nothing computed from it.
"""

from __future__ import annotations

import functools

import torch

# Imported first: it switches Triton to its interpreter on a machine without a GPU (tests).
from bass.kernels import triton_attention
from bass.kernels.triton_sampling import _BLOCK, _noise, _ordered, _scaled_block

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

_ABOVE_BUFFER = 256
_BANDS = 16  # thresholds 0.54, 1.16, 1.86, ... 5.56 (the 8th), ... 18.24 under the largest scaled logit
_WAYS = 16  # keys tested per pass of the exact cut's search: 4 bits of a 32-bit key a pass
# Races above the last winner before the search takes over: each lands in a nucleus with at
# least top_p's chance, so 8 leave (1 - top_p)^8 of such rows to the search (0.4% at top-p 0.5).
_ROUNDS = 8


@triton.jit
def _band_depth(j):
    return 0.5 * (j + 1) + 0.04 * (j + 1) * (j + 1)


@triton.jit
def _race_all_kernel(logits_ptr, divisor_ptr, keys_ptr, greedy_ptr, best_ptr, best_id_ptr, block_max_ptr,
                     block_sum_ptr, gathered_ptr, vocab, row_stride, num_blocks, BLOCK: tl.constexpr):
    """Program (row, block): the block's race winner over every token (the plain argmax for
    greedy rows), its largest scaled logit and sum of exp(scaled - that)."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols, in_vocab, scaled = _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
    greedy = tl.load(greedy_ptr + row) != 0
    score = tl.where(greedy, scaled, scaled + _noise(tl.load(keys_ptr + row).to(tl.uint32), cols))
    # NaN (a graph's padding rows) as -inf: every row's winner is a token id, whatever its logits.
    score = tl.where(in_vocab & (score == score), score, float("-inf"))
    out = row * num_blocks + block
    tl.store(best_ptr + out, tl.max(score, axis=0))
    tl.store(best_id_ptr + out, block * BLOCK + tl.argmax(score, axis=0, tie_break_left=True))
    top = tl.max(tl.where(in_vocab, scaled, float("-inf")), axis=0)
    tl.store(block_max_ptr + out, top)
    tl.store(block_sum_ptr + out, tl.sum(tl.where(in_vocab, tl.exp(scaled - top), 0.0), axis=0))
    if block == 0:
        tl.store(gathered_ptr + row, 0)  # the second pass's count of gathered tokens


@triton.jit
def _race_combine_kernel(logits_ptr, divisor_ptr, best_ptr, best_id_ptr, block_max_ptr, block_sum_ptr, winner_ptr,
                         stats_ptr, row_stride, num_blocks, NB: tl.constexpr):
    """One program per row: the race's winner w (the first block's on ties: the lowest token id,
    as torch's argmax), and the row's (log-sum-exp, largest scaled logit, w's scaled logit, the
    third pass's threshold: +inf, none yet)."""
    row = tl.program_id(0)
    b = tl.arange(0, NB)
    valid = b < num_blocks
    best = tl.load(best_ptr + row * num_blocks + b, mask=valid, other=float("-inf"))
    winner = tl.load(best_id_ptr + row * num_blocks + tl.argmax(best, axis=0, tie_break_left=True))
    block_max = tl.load(block_max_ptr + row * num_blocks + b, mask=valid, other=float("-inf"))
    top = tl.max(block_max, axis=0)
    block_sum = tl.load(block_sum_ptr + row * num_blocks + b, mask=valid, other=0.0)
    lse = top + tl.log(tl.sum(tl.where(valid, block_sum * tl.exp(block_max - top), 0.0), axis=0))
    value = tl.load(logits_ptr + row * row_stride + winner).to(tl.float32) / tl.load(divisor_ptr + row)
    tl.store(winner_ptr + row, winner)
    tl.store(stats_ptr + row * 4, lse)
    tl.store(stats_ptr + row * 4 + 1, top)
    tl.store(stats_ptr + row * 4 + 2, value)
    tl.store(stats_ptr + row * 4 + 3, float("inf"))


@triton.jit
def _gather_above(scaled, cols, above, gathered_ptr, above_value_ptr, above_id_ptr, row, BUFFER: tl.constexpr):
    """Append a block's tokens where `above` to the row's buffer (in any order: only their
    values and ids matter to what is computed from them)."""
    n = tl.sum(above.to(tl.int32), axis=0)
    if n > 0:
        start = tl.atomic_add(gathered_ptr + row, n)
        slot = start + tl.cumsum(above.to(tl.int32), axis=0) - 1
        keep = above & (slot < BUFFER)
        tl.store(above_value_ptr + row * BUFFER + slot, scaled, mask=keep)
        tl.store(above_id_ptr + row * BUFFER + slot, cols, mask=keep)


@triton.jit
def _above_winner_kernel(logits_ptr, divisor_ptr, truncating_ptr, stats_ptr, mass_ptr, count_ptr, gathered_ptr,
                         above_value_ptr, above_id_ptr, vocab, row_stride, num_blocks, BLOCK: tl.constexpr,
                         BUFFER: tl.constexpr):
    """Program (row, block), for truncating rows whose winner is not their most likely token:
    the block's probability mass and count of tokens strictly above the winner's scaled logit,
    those tokens gathered."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    if tl.load(truncating_ptr + row) != 0:
        lse = tl.load(stats_ptr + row * 4)
        value = tl.load(stats_ptr + row * 4 + 2)
        if value < tl.load(stats_ptr + row * 4 + 1):
            cols, in_vocab, scaled = _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
            above = in_vocab & (scaled > value)
            out = row * num_blocks + block
            tl.store(mass_ptr + out, tl.sum(tl.where(above, tl.exp(scaled - lse), 0.0), axis=0))
            tl.store(count_ptr + out, tl.sum(above.to(tl.int32), axis=0))
            _gather_above(scaled, cols, above, gathered_ptr, above_value_ptr, above_id_ptr, row, BUFFER)


@triton.jit
def _race_in_buffer(above_value_ptr, above_id_ptr, row, n, lse, top_k, top_p, key, BUFFER: tl.constexpr):
    """The race's token over the row's n gathered tokens, which hold every token its cut keeps:
    the cut as engine/sampling._cut_in_window_reference finds it over the sorted row, then the
    race over the tokens at or above it (ties to the lowest id, as torch's argmax)."""
    r = tl.arange(0, BUFFER)
    filled = r < n
    values = tl.load(above_value_ptr + row * BUFFER + r, mask=filled, other=float("-inf"))
    ids = tl.load(above_id_ptr + row * BUFFER + r, mask=filled, other=0)
    ordered = tl.sort(values, descending=True)
    by_k = filled & ((top_k == 0) | (r < top_k))
    by_rank = tl.where(by_k, tl.exp(ordered - lse), 0.0)
    kept_mass = tl.where(top_k > 0, tl.sum(by_rank, axis=0), 1.0)
    keep = by_k & (tl.cumsum(by_rank, axis=0) - by_rank < top_p * kept_mass)
    last = tl.maximum(tl.sum(keep.to(tl.int32), axis=0), 1) - 1
    cut = tl.max(tl.where(r == last, ordered, float("-inf")), axis=0)
    score = tl.where(filled & (values >= cut), values + _noise(key, ids), float("-inf"))
    best = tl.max(score, axis=0)
    return tl.min(tl.where(score == best, ids, 2147483647), axis=0).to(tl.int64)  # unfilled: id 0


@triton.jit
def _race_decide_kernel(truncating_ptr, top_k_ptr, top_p_ptr, keys_ptr, winner_ptr, stats_ptr, mass_ptr,
                        count_ptr, above_value_ptr, above_id_ptr, token_ptr, needs_band_ptr, needs_exact_ptr,
                        num_blocks, NB: tl.constexpr, BUFFER: tl.constexpr):
    """One program per row: the row's token. The winner where the cut keeps it; else, from the
    gathered tokens above it where they hold all the cut keeps; else the winner for now, the row
    marked for the thresholds (_band_stats_kernel)."""
    row = tl.program_id(0)
    token = tl.load(winner_ptr + row)
    needs_band = 0
    if tl.load(truncating_ptr + row) != 0:
        lse = tl.load(stats_ptr + row * 4)
        value = tl.load(stats_ptr + row * 4 + 2)
        if value < tl.load(stats_ptr + row * 4 + 1):
            b = tl.arange(0, NB)
            valid = b < num_blocks
            mass = tl.sum(tl.load(mass_ptr + row * num_blocks + b, mask=valid, other=0.0), axis=0)
            n = tl.sum(tl.load(count_ptr + row * num_blocks + b, mask=valid, other=0), axis=0)
            top_k = tl.load(top_k_ptr + row)
            top_p = tl.load(top_p_ptr + row)
            # With top_k and n < top_k, top-p's share is of a mass top_k keeps that reaches
            # below the winner: at least the mass above it and its own.
            share_of = tl.where(top_k > 0, mass + tl.exp(value - lse), 1.0)
            kept = ((top_k == 0) | (n < top_k)) & ((top_p >= 1.0) | (mass < top_p * share_of))
            if kept == 0:
                if ((top_k == 0) | (n >= top_k)) & (n <= BUFFER):
                    key = tl.load(keys_ptr + row).to(tl.uint32)
                    token = _race_in_buffer(above_value_ptr, above_id_ptr, row, n, lse, top_k, top_p, key, BUFFER)
                else:
                    needs_band = 1
    tl.store(token_ptr + row, token)
    tl.store(needs_band_ptr + row, needs_band)
    tl.store(needs_exact_ptr + row, 0)


@triton.jit
def _band_stats_kernel(logits_ptr, divisor_ptr, needs_band_ptr, stats_ptr, band_mass_ptr, band_count_ptr, vocab,
                       row_stride, num_blocks, BLOCK: tl.constexpr, BANDS: tl.constexpr):
    """Program (row, block), for marked rows: the block's mass and count above each band's
    threshold under the row's largest scaled logit."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    if tl.load(needs_band_ptr + row) != 0:
        lse = tl.load(stats_ptr + row * 4)
        top = tl.load(stats_ptr + row * 4 + 1)
        cols, in_vocab, scaled = _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
        probs = tl.where(in_vocab, tl.exp(scaled - lse), 0.0)
        out = (row * num_blocks + block) * BANDS
        for j in tl.static_range(BANDS):
            in_band = in_vocab & (scaled > top - _band_depth(j))
            tl.store(band_mass_ptr + out + j, tl.sum(tl.where(in_band, probs, 0.0), axis=0))
            tl.store(band_count_ptr + out + j, tl.sum(in_band.to(tl.int32), axis=0))


@triton.jit
def _band_choice_kernel(top_k_ptr, top_p_ptr, needs_band_ptr, stats_ptr, band_mass_ptr, band_count_ptr, gathered_ptr,
                        needs_exact_ptr, num_blocks, NB: tl.constexpr, BUFFER: tl.constexpr, BANDS: tl.constexpr):
    """One program per marked row: the highest threshold sure to hold every token the cut keeps
    (top-p's mass, or top_k tokens) within the buffer, for the third pass (stats[3]); where
    there is none, the row is left to the exact search (_exact_cut_kernel)."""
    row = tl.program_id(0)
    if tl.load(needs_band_ptr + row) != 0:
        b = tl.arange(0, NB)
        valid = b < num_blocks
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        depth = float("inf")
        for j in tl.static_range(BANDS - 1, -1, -1):
            at = (row * num_blocks + b) * BANDS + j
            band_mass = tl.sum(tl.load(band_mass_ptr + at, mask=valid, other=0.0), axis=0)
            band_count = tl.sum(tl.load(band_count_ptr + at, mask=valid, other=0), axis=0)
            holds = tl.where(top_k > 0, band_count >= top_k, band_mass >= top_p)
            depth = tl.where(holds & (band_count <= BUFFER), _band_depth(j), depth)
        if depth < float("inf"):
            tl.store(stats_ptr + row * 4 + 3, tl.load(stats_ptr + row * 4 + 1) - depth)
            tl.store(gathered_ptr + row, 0)
        else:
            tl.store(needs_exact_ptr + row, 1)


@triton.jit
def _gather_rethreshold_kernel(logits_ptr, divisor_ptr, stats_ptr, gathered_ptr, above_value_ptr, above_id_ptr,
                               vocab, row_stride, BLOCK: tl.constexpr, BUFFER: tl.constexpr):
    """Program (row, block), for rows given a threshold: their tokens above it gathered."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    threshold = tl.load(stats_ptr + row * 4 + 3)
    if threshold < float("inf"):
        cols, in_vocab, scaled = _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
        _gather_above(scaled, cols, in_vocab & (scaled > threshold), gathered_ptr, above_value_ptr, above_id_ptr,
                      row, BUFFER)


@triton.jit
def _race_rethreshold_kernel(top_k_ptr, top_p_ptr, keys_ptr, stats_ptr, gathered_ptr, above_value_ptr, above_id_ptr,
                             token_ptr, BUFFER: tl.constexpr):
    """One program per row given a threshold: its token from the tokens gathered above it."""
    row = tl.program_id(0)
    if tl.load(stats_ptr + row * 4 + 3) < float("inf"):
        key = tl.load(keys_ptr + row).to(tl.uint32)
        token = _race_in_buffer(above_value_ptr, above_id_ptr, row, tl.load(gathered_ptr + row),
                                tl.load(stats_ptr + row * 4), tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), key,
                                BUFFER)
        tl.store(token_ptr + row, token)


@triton.jit
def _finite_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK: tl.constexpr):
    """_scaled_block with NaN as -inf, as the race reads it."""
    cols, in_vocab, scaled = _scaled_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
    return cols, in_vocab, tl.where(scaled == scaled, scaled, float("-inf"))


@triton.jit
def _keyed_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK: tl.constexpr):
    """_finite_block, and each value's key: its fp32 bits as an int64 in the values' order."""
    cols, in_vocab, scaled = _finite_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
    return cols, in_vocab, scaled, _ordered(scaled.to(tl.int32, bitcast=True)).to(tl.int64)


@triton.jit
def _above_keys(logits_ptr, divisor_ptr, row, keys, lse, vocab, row_stride, num_blocks, BLOCK: tl.constexpr):
    """For each key of `keys` [W]: the row's count [W] and probability mass [W] of tokens whose
    key is greater, in one pass over the row."""
    count = tl.zeros(keys.shape, tl.int32)
    mass = tl.zeros(keys.shape, tl.float32)
    for block in range(num_blocks):
        cols, in_vocab, scaled, key = _keyed_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
        above = in_vocab[None, :] & (key[None, :] > keys[:, None])
        count += tl.sum(above.to(tl.int32), axis=1)
        mass += tl.sum(tl.where(above, tl.exp(scaled - lse)[None, :], 0.0), axis=1)
    return count, mass


@triton.jit
def _smallest_key_below(logits_ptr, divisor_ptr, row, lo, hi, lse, limit, BY_COUNT: tl.constexpr, vocab, row_stride,
                        num_blocks, BLOCK: tl.constexpr, WAYS: tl.constexpr):
    """The smallest key x in [lo, hi] whose count (BY_COUNT) or mass of tokens above it is
    below `limit`, which hi's is: each pass tests WAYS keys spread over the range and keeps the
    part between the last that fails and the first that holds (at most 8 passes for 32 bits)."""
    ways = tl.arange(0, WAYS).to(tl.int64)
    while lo < hi:
        tested = lo + ((hi - lo) * ways) // WAYS  # tested[0] == lo
        count, mass = _above_keys(logits_ptr, divisor_ptr, row, tested, lse, vocab, row_stride, num_blocks, BLOCK)
        if BY_COUNT:
            holds = count < limit
        else:
            holds = mass < limit
        hi = tl.min(tl.where(holds, tested, hi), axis=0)
        lo = tl.max(tl.where(holds, lo, tested + 1), axis=0)
    return lo


@triton.jit
def _race_above(logits_ptr, divisor_ptr, row, floor, noise_key, vocab, row_stride, num_blocks, BLOCK: tl.constexpr):
    """The race over the row's tokens whose scaled logit is above `floor`: (winner id, its
    scaled logit), in one pass (ties to the lowest id, as torch's argmax)."""
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), 0, tl.int64)
    best_value = tl.full((), float("-inf"), tl.float32)
    for block in range(num_blocks):
        cols, in_vocab, scaled = _finite_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride, BLOCK)
        score = tl.where(in_vocab & (scaled > floor), scaled + _noise(noise_key, cols), float("-inf"))
        block_best = tl.max(score, axis=0)
        at = tl.argmax(score, axis=0, tie_break_left=True)
        better = block_best > best
        best_id = tl.where(better, (block * BLOCK + at).to(tl.int64), best_id)
        best_value = tl.where(better, tl.max(tl.where(cols == block * BLOCK + at, scaled, float("-inf")), axis=0),
                              best_value)
        best = tl.maximum(best, block_best)
    return best_id, best_value


@triton.jit
def _exact_cut_kernel(logits_ptr, divisor_ptr, keys_ptr, top_k_ptr, top_p_ptr, stats_ptr, needs_exact_ptr, token_ptr,
                      vocab, row_stride, num_blocks, BLOCK: tl.constexpr, WAYS: tl.constexpr, ROUNDS: tl.constexpr):
    """One program per row the thresholds could not place in the buffer (a nucleus of
    hundreds of tokens, a top_k beyond the buffer), whose race winner w the cut drops; the
    other rows return at once. Every token a nucleus keeps lies above w, so the race over the
    tokens above w alone has the row's token as its winner whenever the cut keeps that winner,
    which the mass above it tells; if not, the same again above the new winner. Each round is
    two passes over the row and lands in the cut with at least top_p's chance (the cut's share
    of what is left), so a nucleus takes 1 / top_p rounds on average (the cut's exact value is
    never needed). With top_k (rare here: more than the buffer holds) the k-th largest value
    v_k comes first, from a search over the values' keys (_smallest_key_below), and with it
    the top_k tokens' mass that top_p is a share of."""
    row = tl.program_id(0)
    if tl.load(needs_exact_ptr + row) != 0:
        lse = tl.load(stats_ptr + row * 4)
        floor = tl.load(stats_ptr + row * 4 + 2)  # the winner's scaled logit: a nucleus lies above it
        top_k = tl.minimum(tl.load(top_k_ptr + row), vocab)
        top_p = tl.load(top_p_ptr + row)
        noise_key = tl.load(keys_ptr + row).to(tl.uint32)
        share = top_p  # of the mass top_k keeps: all of it, without top_k
        v_k = tl.full((), float("-inf"), tl.float32)
        if top_k > 0:
            hi = _ordered(tl.load(stats_ptr + row * 4 + 1).to(tl.int32, bitcast=True)).to(tl.int64)
            lo = hi
            for block in range(num_blocks):
                cols, in_vocab, scaled, key = _keyed_block(logits_ptr, divisor_ptr, row, block, vocab, row_stride,
                                                           BLOCK)
                lo = tl.minimum(lo, tl.min(tl.where(in_vocab, key, hi), axis=0))
            at_k = _smallest_key_below(logits_ptr, divisor_ptr, row, lo, hi, lse, top_k, True, vocab, row_stride,
                                       num_blocks, BLOCK, WAYS)
            count, mass = _above_keys(logits_ptr, divisor_ptr, row, tl.full((1,), 0, tl.int64) + at_k, lse, vocab,
                                      row_stride, num_blocks, BLOCK)
            v_k = _ordered(at_k.to(tl.int32)).to(tl.float32, bitcast=True)
            share = top_p * (tl.sum(mass, axis=0) + (top_k - tl.sum(count, axis=0)).to(tl.float32) * tl.exp(v_k - lse))
            # The race over the tokens at or above v_k: above the next value down. (Not above
            # w: with top_k, _race_decide_kernel may drop a winner the cut keeps, its share of
            # the top_k mass then unknown.)
            below = _ordered((at_k - 1).to(tl.int32)).to(tl.float32, bitcast=True)
            floor = tl.where(v_k > float("-inf"), below, float("-inf"))
        token, value = _race_above(logits_ptr, divisor_ptr, row, floor, noise_key, vocab, row_stride, num_blocks,
                                   BLOCK)
        done = (top_p >= 1.0).to(tl.int32)
        for _ in range(ROUNDS):
            if done == 0:
                # The mass above the winner: the cut keeps it where that is below top_p's share.
                at = tl.full((1,), 0, tl.int64) + _ordered(value.to(tl.int32, bitcast=True)).to(tl.int64)
                count, mass = _above_keys(logits_ptr, divisor_ptr, row, at, lse, vocab, row_stride, num_blocks, BLOCK)
                if tl.sum(mass, axis=0) < share:
                    done = 1
                else:  # the cut lies above this winner too
                    floor = value
                    token, value = _race_above(logits_ptr, divisor_ptr, row, floor, noise_key, vocab, row_stride,
                                               num_blocks, BLOCK)
        if done == 0:
            # Rounds used up (a cut holding a small share of what lies above the winners, or NaN
            # logits): the cut's value from a search between the floor (below the cut: the last
            # winner it dropped, or v_k's next value down) and the top, then the race at or
            # above it. Bounded, and exact.
            hi = _ordered(tl.load(stats_ptr + row * 4 + 1).to(tl.int32, bitcast=True)).to(tl.int64)
            lo = tl.minimum(_ordered(floor.to(tl.int32, bitcast=True)).to(tl.int64) + 1, hi)
            cut = _smallest_key_below(logits_ptr, divisor_ptr, row, lo, hi, lse, share, False, vocab, row_stride,
                                      num_blocks, BLOCK, WAYS)
            below = _ordered((cut - 1).to(tl.int32)).to(tl.float32, bitcast=True)
            token, value = _race_above(logits_ptr, divisor_ptr, row, below, noise_key, vocab, row_stride, num_blocks,
                                       BLOCK)
        tl.store(token_ptr + row, token)


def race_first(logits: torch.Tensor, divisor: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               row_keys: torch.Tensor, greedy: torch.Tensor, truncating: torch.Tensor,
               exact: bool = True) -> torch.Tensor:
    """engine/sampling.race's tokens (int64 [R]) in nine launches, with no top-k selection and
    no host sync. logits [R, V] any float dtype; divisor fp32 [R] (1 for greedy rows); top_k
    int [R] (0: off); top_p fp32 [R]; row_keys int64 [R]; greedy, truncating bool [R]
    (truncating: a sampled row with top-k or top-p). exact=False (a draft's proposals, which
    need only be close): the rows the buffer cannot settle keep their race winner instead of
    the exact search, and the ninth launch is left out."""
    rows, vocab = logits.shape
    logits = logits.contiguous()
    dev = logits.device
    num_blocks = triton.cdiv(vocab, _BLOCK)
    nb = triton.next_power_of_2(num_blocks)
    divisor = divisor.float().contiguous()
    truncating = truncating.to(torch.int8).contiguous()
    top_k, top_p = top_k.contiguous(), top_p.float().contiguous()
    per_block = functools.partial(torch.empty, rows, num_blocks, device=dev)
    best, block_max, block_sum, mass = (per_block(dtype=torch.float32) for _ in range(4))
    best_id, count = per_block(dtype=torch.int64), per_block(dtype=torch.int32)
    band_mass = torch.empty(rows, num_blocks, _BANDS, dtype=torch.float32, device=dev)
    band_count = torch.empty(rows, num_blocks, _BANDS, dtype=torch.int32, device=dev)
    gathered = torch.empty(rows, dtype=torch.int32, device=dev)
    winner = torch.empty(rows, dtype=torch.int64, device=dev)
    stats = torch.empty(rows, 4, dtype=torch.float32, device=dev)
    above_value = torch.empty(rows, _ABOVE_BUFFER, dtype=torch.float32, device=dev)
    above_id = torch.empty(rows, _ABOVE_BUFFER, dtype=torch.int32, device=dev)
    token = torch.empty(rows, dtype=torch.int64, device=dev)
    needs_band = torch.empty(rows, dtype=torch.int8, device=dev)
    needs_exact = torch.empty(rows, dtype=torch.int8, device=dev)
    if rows:
        if triton_attention._INTERPRETED:  # loop bounds from tensors (the interpreter's NumPy fix)
            triton_attention._patch_interpreter_index()
        keys = row_keys.contiguous()
        stride = logits.stride(0)
        _race_all_kernel[(rows, num_blocks)](logits, divisor, keys, greedy.to(torch.int8).contiguous(), best, best_id,
                                             block_max, block_sum, gathered, vocab, stride, num_blocks, BLOCK=_BLOCK)
        _race_combine_kernel[(rows,)](logits, divisor, best, best_id, block_max, block_sum, winner, stats, stride,
                                      num_blocks, NB=nb)
        _above_winner_kernel[(rows, num_blocks)](logits, divisor, truncating, stats, mass, count, gathered, above_value,
                                                 above_id, vocab, stride, num_blocks, BLOCK=_BLOCK, BUFFER=_ABOVE_BUFFER)
        _race_decide_kernel[(rows,)](truncating, top_k, top_p, keys, winner, stats, mass, count, above_value, above_id,
                                     token, needs_band, needs_exact, num_blocks, NB=nb, BUFFER=_ABOVE_BUFFER)
        _band_stats_kernel[(rows, num_blocks)](logits, divisor, needs_band, stats, band_mass, band_count, vocab, stride,
                                               num_blocks, BLOCK=_BLOCK, BANDS=_BANDS)
        _band_choice_kernel[(rows,)](top_k, top_p, needs_band, stats, band_mass, band_count, gathered, needs_exact,
                                     num_blocks, NB=nb, BUFFER=_ABOVE_BUFFER, BANDS=_BANDS)
        _gather_rethreshold_kernel[(rows, num_blocks)](logits, divisor, stats, gathered, above_value, above_id, vocab,
                                                       stride, BLOCK=_BLOCK, BUFFER=_ABOVE_BUFFER)
        _race_rethreshold_kernel[(rows,)](top_k, top_p, keys, stats, gathered, above_value, above_id, token,
                                          BUFFER=_ABOVE_BUFFER)
        if exact:
            _exact_cut_kernel[(rows,)](logits, divisor, keys, top_k, top_p, stats, needs_exact, token, vocab, stride,
                                       num_blocks, BLOCK=_BLOCK, WAYS=_WAYS, ROUNDS=_ROUNDS, num_warps=8)
    return token
