"""Turning logits into tokens: distribution shaping, keyed Gumbel noise, the token race; and the
compact q (a row's top-N shaped distribution) that acceptance measurements compare rules on.

Shaping (temperature, top-k, top-p) is the single definition of "the distribution a sequence
samples from"; regular decoding, the draft and the verifier all call it. A sampled token is the
winner of a Gumbel race: the argmax of the shaped logits plus noise keyed by (sequence seed,
position, token id). That is an exact sample of the shaped distribution, and a pure function of
it and the key, so the target emits the same token at a position whatever the draft proposed,
whether it proposed at all, and whatever else is in the batch. The draft runs the same race
over its own distribution with the same noise, which makes it propose the target's token as
often as two distributions that differ allow (the Gumbel coupling).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from bass.core.config import SamplingParams
from bass.engine.transfer import to_device

_M32 = 0xFFFFFFFF
# Mixed into every noise key, so this randomness never coincides with another use of the seed.
_NOISE_DOMAIN = 0x47554D42
_ROW_CHUNK_ELEMENTS = 1 << 23  # bounds the int64 temporaries of the reference noise


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanching 32-bit integer hash ("lowbias32") on int64 tensors holding values < 2**32.

    Products may wrap past int64, but masking keeps their low 32 bits exact, so CPU and GPU
    (and the Triton kernel, in uint32) agree bit for bit.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def noise_keys(seed_keys: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
    """One 32-bit key per row for (sequence seed key, token position), on the host: int64 [R].

    Hashed with NumPy on the CPU and copied once: a few dozen tiny integer ops, which as GPU
    launches (or as CPU torch ops, ~0.2 ms for 40 rows) would cost more than the sampling
    itself. The same lowbias32 steps as _mix32, in uint64 masked to 32 bits."""
    keys = np.array([k & _M64 for k in seed_keys], dtype=np.uint64)
    h = _mix32_np((keys & _M32_NP) ^ np.uint64(_NOISE_DOMAIN))
    h = _mix32_np(h ^ ((keys >> np.uint64(32)) & _M32_NP))
    h = _mix32_np(h ^ (np.array(positions, dtype=np.uint64) & _M32_NP))
    return torch.from_numpy(h.astype(np.int64))


_M64 = (1 << 64) - 1
_M32_NP = np.uint64(_M32)


def _mix32_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _M32_NP
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _M32_NP
    return x ^ (x >> np.uint64(16))


def gumbel_noise(row_keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float32 [R, N], a pure function of (row key, token id): the same
    token at the same position of the same sequence gets the same noise in every model, batch
    and call. row_keys: int64 [R] from noise_keys; token_ids: int64 [R, N] or [1, N]."""
    h = _mix32(row_keys[:, None] ^ token_ids)
    h = _mix32((h + 0x68E31DA4) & _M32)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), 24 bits
    return -torch.log(-torch.log(u))


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters as tensors, so one batch can mix settings."""

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_k: torch.Tensor  # [R] int64, 0 = off
    top_p: torch.Tensor  # [R] float32
    divisor: torch.Tensor  # [R] float32: what the logits are divided by (1 for greedy rows)
    greedy: torch.Tensor  # [R] bool
    truncating: torch.Tensor  # [R] bool: a sampled row with top-k or top-p
    all_greedy: bool
    any_greedy: bool
    any_truncation: bool
    max_top_k: int  # known on the host, so that choosing a code path needs no device sync

    @classmethod
    def build(cls, params: list[SamplingParams], device: torch.device | str) -> "RowParams":
        if all(p.greedy for p in params):
            # Every consumer takes the argmax then (the common greedy step): no copies at all.
            nothing = torch.empty(0, device=device)
            return cls(temperature=nothing, top_k=nothing, top_p=nothing, divisor=nothing, greedy=nothing,
                       truncating=nothing, all_greedy=True, any_greedy=bool(params), any_truncation=False,
                       max_top_k=max((p.top_k for p in params), default=0))
        # Two copies to the device, one per dtype: each copy is a host round of its own.
        floats, ints = cls.columns(params)
        return cls.from_columns(to_device(floats, torch.float32, device), to_device(ints, torch.int64, device),
                                any_greedy=any(p.greedy for p in params), any_truncation=any(ints[2]),
                                max_top_k=max((p.top_k for p in params if not p.greedy), default=0))

    @staticmethod
    def columns(params: list[SamplingParams]) -> tuple[list[list[float]], list[list[int]]]:
        """The rows' parameters as host columns: floats (temperature, divisor, top_p) and ints
        (top_k, greedy, truncating). Greedy rows carry no top-k / top-p, so that no cut is ever
        searched for them."""
        floats = [[p.temperature for p in params], [p.temperature if not p.greedy else 1.0 for p in params],
                  [1.0 if p.greedy else p.top_p for p in params]]
        ints = [[0 if p.greedy else p.top_k for p in params], [int(p.greedy) for p in params],
                [int(not p.greedy and (p.top_k > 0 or p.top_p < 1)) for p in params]]
        return floats, ints

    @classmethod
    def from_columns(cls, floats: torch.Tensor, ints: torch.Tensor, *, any_greedy: bool, any_truncation: bool,
                     max_top_k: int) -> "RowParams":
        """Rows of sampled (or mixed) parameters from device columns laid out as `columns` makes
        them ([3, R] float32 and int64); the flags are the host's knowledge of them."""
        return cls(temperature=floats[0], divisor=floats[1], top_p=floats[2],
                   top_k=ints[0], greedy=ints[1].bool(), truncating=ints[2].bool(),
                   all_greedy=False, any_greedy=any_greedy, any_truncation=any_truncation, max_top_k=max_top_k)

    def take(self, index: torch.Tensor) -> "RowParams":
        """The rows at `index` (flags stay conservative: they may over-report)."""
        if self.all_greedy:
            return self
        return replace(self, temperature=self.temperature[index], top_k=self.top_k[index], top_p=self.top_p[index],
                       divisor=self.divisor[index], greedy=self.greedy[index], truncating=self.truncating[index])


def _scaled(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """fp32 logits / temperature (greedy rows unscaled)."""
    return logits.float() / rows.divisor[:, None]


# The exact path (`race`, `truncation_cut`: the CPU's decode steps, and the reference the GPU's
# race_first is tested against) finds each row's top-k / top-p cut among the row's CUT_WINDOW largest
# logits: for code at the temperatures users pick the nucleus nearly always lies inside, and a
# top-k of 256 values costs a fraction of sorting 152k (a full sort took 0.9 of a sampled
# verification's 3.3 ms of GPU time at batch 8 on an H100). Rows whose cut lies beyond the
# window: on a GPU, top-p rows get it from a bisection kernel at once; top-k rows (top_k > the
# window), and every such row on the CPU, sort in full. A GPU's decode steps race first instead
# (kernels/triton_race_first.py), with no top-k selection at all.
CUT_WINDOW = 256
_KERNEL_WINDOW = 4096  # the widest window the one-program cut kernel takes


def truncation_cut(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   window: int = CUT_WINDOW) -> torch.Tensor:
    """Per row, the smallest scaled logit that top-k / top-p keep: fp32 [R].

    By rank: keep each row's top_k most likely tokens (0 = all) and, of those, the smallest set
    whose mass reaches top_p of what top_k kept. The cut is the value of the last token kept, and
    a row keeps every token at or above it, so tokens tied with it are all kept: the set is a
    function of the values alone, never of how a sort ordered equal ones.

    Exact for every row: the window's answer is used where the cut provably lies inside it (top-p
    dropped a token of the window, or top_k fits in it), and the other rows (rare; one host sync
    tells) are sorted whole. Both paths compute a row's cut from that row alone, so the choice
    never depends on the rest of the batch.
    """
    cut, outside, lse = _windowed_cut(scaled, top_k, top_p, window)
    if outside is not None and bool(outside.any()):
        rows = outside.nonzero().squeeze(1)
        cut[rows] = _cut_in_window(scaled[rows].sort(dim=-1, descending=True).values, lse[rows], top_k[rows],
                                   top_p[rows])[0]
    return cut


def _windowed_cut(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  window: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """truncation_cut's window step, with no host sync: (cut [R], outside [R] bool or None
    when the window is the whole row, lse [R, 1]). Where outside is set, the cut is not the
    row's (the row needs the sorted path)."""
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    if window >= scaled.shape[-1]:
        return _cut_in_window(scaled.sort(dim=-1, descending=True).values, lse, top_k, top_p)[0], None, lse
    top = scaled.topk(window, dim=-1).values  # sorted, descending
    cut, inside = _cut_in_window(top, lse, top_k, top_p)
    outside = ~inside & ((top_k > 0) | (top_p < 1))  # rows that keep everything need no cut
    if scaled.is_cuda:
        # On a GPU a top-p row whose nucleus outgrows the window gets its exact cut at once, on
        # the device (kernels/triton_sampling.nucleus_cut: a bisection over the row, no sort, no
        # sync). On an H100 at batch 64 x 5 rows, Verify alternated 7.7-8.2 and 12.3-12.6 ms
        # from step to step, the slow half read (not traced) as the host redoing such a row.
        from bass.kernels.triton_sampling import nucleus_cut

        exact = outside & (top_k == 0)
        nucleus_cut(scaled, lse, top_p, exact, cut)
        outside = outside & ~exact
    return cut, outside, lse


def shaped_logits(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """logits / temperature with the tokens top-k / top-p drop at -inf: fp32 [R, V]. Their
    softmax is the distribution a sampled row draws from (greedy rows: see shape_probs)."""
    scaled = _scaled(logits, rows)
    if rows.any_truncation:
        cut = truncation_cut(scaled, rows.top_k, rows.top_p)
        scaled = scaled.masked_fill(scaled < cut[:, None], float("-inf"))
    return scaled


def shape_probs(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """Probabilities [R, V] (fp32) after temperature, top-k and top-p; greedy rows are one-hot."""
    if rows.all_greedy:
        return _one_hot_argmax(logits.float())
    probs = torch.softmax(shaped_logits(logits, rows), dim=-1)
    if rows.any_greedy:
        greedy = rows.greedy[:, None]
        probs = torch.where(greedy, _one_hot_argmax(logits.float()), probs)
    return probs


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(logits, dtype=torch.float32)
    return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def race(logits: torch.Tensor, rows: RowParams, row_keys: torch.Tensor | None) -> torch.Tensor:
    """The token each row emits: int64 [R].

    Greedy rows take the argmax. Sampled rows run a Gumbel race: the argmax of their shaped
    logits plus the keyed noise of (row key, token), an exact sample of the shaped distribution
    (the Gumbel-max trick). The token is therefore a function of the distribution and the key
    alone: whoever proposed what, and whatever else shares the batch. row_keys (int64 [R],
    from noise_keys) may be None when every row is greedy.
    """
    if rows.all_greedy:
        return logits.argmax(dim=-1)
    cut = None
    if rows.any_truncation:
        cut = truncation_cut(_scaled(logits, rows), rows.top_k, rows.top_p)
    return _race_with_cut(logits, rows, cut, row_keys)


def race_unsynced(logits: torch.Tensor, rows: RowParams,
                  row_keys: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """race without its host sync: (tokens [R], redo) where redo is None or a device bool
    [R] set where a row's token was not found exactly on the device. There the token is not
    race's: a caller reads `redo` back with its results and, where any is set, runs `race`
    again. So a sampled step's host queues all of its GPU work and waits once, at the end,
    instead of once in the middle with every later launch exposed.

    On a GPU the race runs first and the cut is found only for rows whose winner it might drop
    (kernels/triton_race_first.race_first: 3-8x faster than a top-k selection of each row's
    window at 1-64 rows on an H100, c1c0375), and every row exactly: redo is None. On the CPU
    the cut comes from each row's CUT_WINDOW largest logits, flagging any row whose cut lies
    beyond them (rare for code at T = 0.8).
    """
    if rows.all_greedy:
        return logits.argmax(dim=-1), None
    if logits.is_cuda:
        return _race_first(logits, rows, row_keys, exact=True), None
    cut = redo = None
    if rows.any_truncation:
        cut, redo, _ = _windowed_cut(_scaled(logits, rows), rows.top_k, rows.top_p, CUT_WINDOW)
    return _race_with_cut(logits, rows, cut, row_keys), redo


def draft_race(logits: torch.Tensor, rows: RowParams, row_keys: torch.Tensor | None, window: int) -> torch.Tensor:
    """The draft's proposal: the target's race at the same position (same keyed noise) run over
    the draft's own distribution, so it picks the target's token as often as the two
    distributions allow. The top-k / top-p cut is found among the draft's `window` most likely
    tokens only (no sort of the vocabulary), or on a GPU by race_first: any proposal rule is
    lossless, since the target decides every token, so the draft's cut only has to be close,
    not exact."""
    if rows.all_greedy:
        return logits.argmax(dim=-1)
    if logits.is_cuda:
        # The target's race, less its exact search for the rare row the buffer cannot settle
        # (a nucleus of hundreds of tokens): that row proposes its race winner.
        return _race_first(logits, rows, row_keys, exact=False)
    cut = window_cut(_scaled(logits, rows), rows.top_k, rows.top_p, window) if rows.any_truncation else None
    return _race_with_cut(logits, rows, cut, row_keys)


def _race_first(logits: torch.Tensor, rows: RowParams, row_keys: torch.Tensor | None, exact: bool) -> torch.Tensor:
    """kernels/triton_race_first.race_first over these rows (a GPU's race)."""
    from bass.kernels.triton_race_first import race_first

    return race_first(logits, rows.divisor, rows.top_k, rows.top_p, row_keys, rows.greedy, rows.truncating,
                      exact=exact)


def window_cut(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, window: int) -> torch.Tensor:
    """truncation_cut computed from each row's `window` largest values: equal to it when the cut
    falls inside the window, else the window's smallest value (the window bounds the set)."""
    top = scaled.topk(min(window, scaled.shape[-1]), dim=-1).values  # sorted, descending
    return _cut_in_window(top, torch.logsumexp(scaled, dim=-1, keepdim=True), top_k, top_p)[0]


def _cut_in_window(top: torch.Tensor, lse: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_cut_in_window_reference for a window `top` of scaled logits whose rows' log-sum-exp
    is `lse` ([R, 1]): on a GPU in one Triton launch (kernels/triton_sampling.window_cut), for
    windows that fit one program (the fallback's whole sorted rows do not)."""
    if top.is_cuda and top.shape[-1] <= _KERNEL_WINDOW:
        from bass.kernels.triton_sampling import window_cut as window_cut_kernel

        return window_cut_kernel(top, lse, top_k, top_p)
    return _cut_in_window_reference(top, torch.exp(top - lse), top_k, top_p)


def _cut_in_window_reference(top: torch.Tensor, probs: torch.Tensor, top_k: torch.Tensor,
                             top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a window of each row's largest scaled logits `top` (descending) and their
    probabilities under the whole row: the cut value [R] (the last token top-k / top-p keep by
    rank), and whether it is the whole row's cut [R] bool: so when top_k fits in the window
    (the mass it keeps is known) and top-p dropped at least one of the window's tokens."""
    width = top.shape[-1]
    rank = torch.arange(width, device=top.device)[None, :]
    by_k = (top_k[:, None] == 0) | (rank < top_k[:, None])
    by_rank = probs * by_k
    # The top-p cut is relative to the mass top_k kept: all of it (1) without top_k.
    kept_mass = torch.where(top_k > 0, by_rank.sum(-1), torch.ones_like(top_p))
    keep = by_k & (by_rank.cumsum(dim=-1) - by_rank < top_p[:, None] * kept_mass[:, None])
    kept = keep.sum(-1, keepdim=True)
    # A top_k beyond the window leaves the kept mass unknown: never inside.
    inside = torch.where(top_k > 0, top_k <= width, kept.squeeze(-1) < width)
    return top.gather(-1, (kept.clamp(min=1) - 1)).squeeze(-1), inside


def _race_with_cut(logits: torch.Tensor, rows: RowParams, cut: torch.Tensor | None,
                   row_keys: torch.Tensor) -> torch.Tensor:
    """Argmax of logits / divisor (+ Gumbel noise for sampled rows) over the tokens at or above
    the row's cut (rows that do not truncate keep everything). One Triton launch on a GPU
    (kernels/triton_sampling.py); this is also its reference."""
    no_cut = torch.full_like(rows.divisor, float("-inf"))
    cut = no_cut if cut is None else torch.where(rows.truncating, cut, no_cut)
    if logits.is_cuda:
        from bass.kernels.triton_sampling import gumbel_race

        return gumbel_race(logits, rows.divisor, cut, row_keys, rows.greedy)
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    vocab_ids = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    step = max(1, _ROW_CHUNK_ELEMENTS // logits.shape[-1])
    for start in range(0, logits.shape[0], step):
        part = slice(start, start + step)
        scaled = logits[part].float() / rows.divisor[part, None]
        noise = torch.where(rows.greedy[part, None], 0.0, gumbel_noise(row_keys[part], vocab_ids))
        scores = torch.where(scaled >= cut[part, None], scaled + noise, float("-inf"))
        out[part] = scores.argmax(dim=-1)
    return out


def compact_shaped(logits: torch.Tensor, rows: RowParams, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """compact(shape_probs(logits, rows), top_n), computed from each row's top_n logits.

    Shaping keeps a prefix of each row's tokens sorted by probability, so the top_n tokens of
    the shaped distribution are the first top_n of that order, and the top-p cut inside them
    needs only their probabilities (a softmax normalizer over the vocabulary gives those).
    This skips sorting, cumulating and scattering whole vocabulary rows: one top-k and one
    log-sum-exp per row. A top_k beyond top_n would need the mass of tokens outside the
    window; those batches take the full path.
    """
    n = min(top_n, logits.shape[-1])
    if rows.all_greedy or rows.max_top_k > n:
        return compact(shape_probs(logits, rows), top_n)
    scaled = _scaled(logits, rows)
    top, ids = scaled.topk(n, dim=-1)  # sorted, descending
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    probs = torch.exp(top - lse)
    if rows.any_truncation:
        # As in truncation_cut: every token at or above the last one kept by rank (ties stay).
        cut = torch.where(rows.truncating, _cut_in_window(top, lse, rows.top_k, rows.top_p)[0],
                          torch.full_like(rows.divisor, float("-inf")))
        probs = probs * (top >= cut[:, None])
    if rows.any_greedy:
        first = torch.zeros_like(probs)
        first[:, 0] = 1.0
        probs = torch.where(rows.greedy[:, None], first, probs)
    return ids, probs / probs.sum(dim=-1, keepdim=True)


def compact(probs: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compact q: each row's top_n tokens with renormalized probabilities.

    The draft samples from exactly this distribution, so the verifier can use it as q and the
    output stays exact; only the acceptance rate depends on top_n.
    """
    n = min(top_n, probs.shape[-1])
    vals, ids = probs.topk(n, dim=-1)
    return ids, vals / vals.sum(dim=-1, keepdim=True)
