"""The Triton Gumbel race against its PyTorch reference (sampling.race): the exact path's kernels
(kernels/triton_sampling.py) and the race run first (kernels/triton_race_first.py); interpreter on
the CPU, the real kernels on a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.core.config import SamplingParams  # noqa: E402
from bass.engine.sampling import RowParams, noise_keys, race, truncation_cut  # noqa: E402
from bass.kernels.triton_sampling import gumbel_race, window_cut  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(), SamplingParams(temperature=1.0),
            SamplingParams(temperature=0.3, top_k=5), SamplingParams(temperature=1.3, top_k=40, top_p=0.5),
            SamplingParams(temperature=0.0, top_k=3)]


def kernel_inputs(logits, params, keys):
    # From the settings themselves: the engine never launches the kernel for all-greedy rows
    # (RowParams then holds no tensors), but these tests do.
    dev = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=dev)
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    truncating = ((top_k > 0) | (top_p < 1)) & ~greedy
    cut = torch.where(truncating, truncation_cut(logits.float() / temperature[:, None], top_k, top_p),
                      torch.full_like(temperature, float("-inf")))
    return temperature, cut, keys.to(logits.device), greedy


@pytest.mark.parametrize("vocab", [37, 5000, 9000])  # one partial block; several blocks
def test_kernel_picks_the_reference_winner(vocab):
    torch.manual_seed(vocab)
    params = SETTINGS * 2
    logits = torch.randn(len(params), vocab) * 3
    keys = noise_keys(range(100, 100 + len(params)), range(len(params)))
    want = race(logits, RowParams.build(params, "cpu"), keys)
    got = gumbel_race(logits.to(DEVICE), *kernel_inputs(logits.to(DEVICE), params, keys)).cpu()
    assert torch.equal(got, want)


def test_kernel_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    params = SETTINGS
    logits = (torch.randn(len(params), 5000) * 2).to(DEVICE)
    keys = noise_keys(range(len(params)), [3] * len(params))
    together = gumbel_race(logits, *kernel_inputs(logits, params, keys))
    for i in range(len(params)):
        alone = gumbel_race(logits[i:i + 1], *kernel_inputs(logits[i:i + 1], params[i:i + 1], keys[i:i + 1]))
        assert alone.item() == together[i].item()


@pytest.mark.parametrize("width", [37, 64, 256])
def test_window_cut_kernel_is_the_reference(width):
    """The one-launch cut over each row's window equals engine/sampling's PyTorch reference:
    top-k inside and beyond the window, top-p cuts at every depth, ties at the cut."""
    from bass.engine.sampling import _cut_in_window_reference

    gen = torch.Generator().manual_seed(width)
    rows = 24
    scaled = torch.randn(rows, 2000, generator=gen) * torch.linspace(0.5, 6, rows)[:, None]
    scaled[3, :10] = scaled[3].max() + 1  # ten tokens tied at the top
    top = scaled.topk(width, dim=-1).values
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    top_k = torch.tensor([0, 1, 5, width, width + 3, 0, 40, 0] * 3)
    top_p = torch.tensor([0.95, 1.0, 0.5, 0.99, 0.9, 0.3, 0.8, 1.0] * 3)
    want_cut, want_inside = _cut_in_window_reference(top, torch.exp(top - lse), top_k, top_p)
    cut, inside = window_cut(top.to(DEVICE), lse.to(DEVICE), top_k.to(DEVICE), top_p.to(DEVICE))
    assert torch.equal(inside.cpu(), want_inside)
    torch.testing.assert_close(cut.cpu(), want_cut, atol=0, rtol=0)
    assert want_inside.any() and not want_inside.all()  # both kinds of rows were checked


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 logits at the real vocabulary size: GPU")
def test_kernel_on_real_vocabulary_bf16():
    torch.manual_seed(1)
    params = SETTINGS * 8
    logits = (torch.randn(len(params), 151_936, device="cuda") * 4).to(torch.bfloat16)
    keys = noise_keys(range(len(params)), range(len(params)))
    got = race(logits, RowParams.build(params, "cuda"), keys.cuda()).cpu()  # dispatches to the kernel
    want = race(logits.float().cpu(), RowParams.build(params, "cpu"), keys)
    # The noise's float transform may round differently on the GPU: only near-ties can differ.
    assert (got == want).float().mean() >= 0.97


@pytest.mark.parametrize("vocab", [50, 3000, 9000])
def test_nucleus_cut_kernel_finds_the_sorted_rows_cut(vocab):
    """kernels/triton_sampling.nucleus_cut, the GPU's exact top-p cut for rows whose nucleus
    outgrows the race's window, against the reference over each sorted row: flat rows (a nucleus
    of thousands), peaked ones, ties at the cut; rows not asked for are left alone."""
    from bass.engine.sampling import _cut_in_window_reference
    from bass.kernels.triton_sampling import nucleus_cut

    torch.manual_seed(vocab)
    scales = torch.tensor([0.05, 0.5, 1.0, 2.0, 4.0, 1.0, 3.0, 0.5])
    scaled = torch.randn(len(scales), vocab) * scales[:, None]
    scaled[6, :10] = 20.0  # ten tied tokens hold nearly all the mass
    scaled[7] = scaled[7].round(decimals=1)  # many ties everywhere
    top_p = torch.tensor([0.95, 0.9, 0.5, 0.99, 0.3, 0.999999, 0.95, 0.8])
    need = torch.ones(len(scales), dtype=torch.bool)
    need[5] = False
    scaled, top_p, need = scaled.to(DEVICE), top_p.to(DEVICE), need.to(DEVICE)
    lse = torch.logsumexp(scaled, dim=-1)
    cut = torch.full((len(scales),), 7.0, device=DEVICE)
    nucleus_cut(scaled, lse, top_p, need, cut)
    ordered = scaled.sort(dim=-1, descending=True).values
    want, _ = _cut_in_window_reference(ordered, torch.exp(ordered - lse[:, None]),
                                       torch.zeros(len(scales), dtype=torch.int64, device=DEVICE), top_p)
    assert torch.equal(cut[need], want[need])
    assert cut[5].item() == 7.0
    assert (scaled[0] >= cut[0]).sum() > vocab // 2, "the flat row keeps most of its tokens"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device path of the window cut")
def test_window_cut_flags_only_top_k_rows_beyond_the_window_on_the_gpu():
    """On a GPU a top-p row whose nucleus outgrows the window gets its exact cut at once; only a
    top_k beyond the window still asks the host to redo the row."""
    from bass.engine.sampling import _windowed_cut

    torch.manual_seed(0)
    scaled = torch.randn(3, 5000, device="cuda") * 0.1  # flat: every nucleus has thousands of tokens
    top_k = torch.tensor([0, 1000, 0], device="cuda")
    top_p = torch.tensor([0.9, 1.0, 1.0], device="cuda")
    cut, outside, lse = _windowed_cut(scaled, top_k, top_p, 16)
    assert outside.tolist() == [False, True, False]
    ordered = scaled[0].sort(descending=True).values
    kept = (torch.exp(ordered - lse[0]).cumsum(0) - torch.exp(ordered - lse[0]) < 0.9).sum()
    assert (scaled[0] >= cut[0]).sum() == kept


def _race_first(logits, params, keys):
    from bass.kernels.triton_race_first import race_first

    # From the settings themselves, as kernel_inputs: all-greedy RowParams hold no tensors.
    temperature, _, keys, greedy = kernel_inputs(logits, params, keys)
    top_k = torch.tensor([0 if p.greedy else p.top_k for p in params], device=logits.device)
    top_p = torch.tensor([1.0 if p.greedy else p.top_p for p in params], device=logits.device)
    return race_first(logits, temperature, top_k, top_p, keys, greedy, ((top_k > 0) | (top_p < 1)) & ~greedy)


def _unrestricted_winner(logits, params, keys):
    """The race over every token (no cut): what race_first answers where the cut keeps it."""
    temperature, _, keys, greedy = kernel_inputs(logits, params, keys)
    return gumbel_race(logits, temperature, torch.full_like(temperature, float("-inf")), keys, greedy)


def _decided_on_the_device(logits, params, keys):
    """race_first's tokens, asserted to be the exact race's, and the unrestricted race's
    winners (CPU tensors)."""
    want = race(logits, RowParams.build(params, "cpu"), keys)
    got = _race_first(logits.to(DEVICE), params, keys).cpu()
    assert torch.equal(got, want)
    return got, _unrestricted_winner(logits.to(DEVICE), params, keys).cpu()


@pytest.mark.parametrize("vocab", [37, 3000, 9000])  # one partial block; several blocks
def test_race_first_is_the_reference_race(vocab):
    """Every row's token is the exact race's: greedy, temperature only, top-p, top-k, both;
    peaked rows (the winner is the most likely token), flatter ones (the winner is often
    outside a small nucleus, decided again from the tokens above it)."""
    torch.manual_seed(vocab)
    params = (SETTINGS + [SamplingParams(temperature=1.0, top_p=0.3), SamplingParams(temperature=0.7, top_k=2)]) * 6
    logits = torch.randn(len(params), vocab) * torch.linspace(0.5, 6, len(params))[:, None]
    keys = noise_keys(range(100, 100 + len(params)), range(len(params)))
    got, unrestricted = _decided_on_the_device(logits, params, keys)
    assert (got != unrestricted).any(), "some rows' winners lay outside their cut and were raced again"


def _crowd_above_the_winner(logits, winner):
    return (logits > logits.gather(1, winner[:, None])).sum(1)


@pytest.mark.parametrize("rounds", [8, 1, 0])
def test_race_first_decides_wide_nuclei_on_the_device(rounds, monkeypatch):
    """Near-uniform rows, so winners fall anywhere and every cut keeps hundreds of tokens: no
    threshold holds the cut within the buffer, and races above the winners the cut drops decide
    them (top-p, top-k beyond the buffer, both), or, once `rounds` are used up, a search for the
    cut's value: the reference's token every time."""
    from bass.kernels import triton_race_first
    from bass.kernels.triton_race_first import _ABOVE_BUFFER

    monkeypatch.setattr(triton_race_first, "_ROUNDS", rounds)

    vocab = 4 * _ABOVE_BUFFER + 100
    torch.manual_seed(3)
    params = ([SamplingParams(temperature=1.0, top_p=0.05)] * 8 + [SamplingParams(temperature=1.0, top_p=0.95)] * 8
              + [SamplingParams(temperature=1.0, top_k=500, top_p=0.05)] * 8
              + [SamplingParams(temperature=1.0, top_k=700)] * 8
              + [SamplingParams(temperature=1.0, top_k=600, top_p=0.9)] * 8)
    logits = torch.randn(len(params), vocab) * 0.01
    keys = noise_keys(range(len(params)), [5] * len(params))
    got, winner = _decided_on_the_device(logits, params, keys)
    outside = got != winner
    assert (outside & (_crowd_above_the_winner(logits, winner) > _ABOVE_BUFFER)).sum() >= 8, \
        "winners outside the cut with more tokens above them than the buffer holds"
    peaked = logits.clone()
    peaked[:, 7] += 30.0  # one token holds nearly all the mass: the winner, kept by every cut
    assert (_race_first(peaked.to(DEVICE), params, keys).cpu() == 7).all()


def test_a_drafts_race_first_leaves_wide_nuclei_to_their_winner():
    """exact=False (the draft's proposals): a row only the exact search would settle keeps its
    race winner; every other row is the exact race's token."""
    from bass.kernels.triton_race_first import race_first

    torch.manual_seed(4)
    params = [SamplingParams(temperature=1.0, top_p=0.5)] * 16 + [SamplingParams(temperature=0.8, top_p=0.95)] * 4
    logits = torch.randn(len(params), 1200) * 0.01
    logits[16:, :5] += 8.0  # peaked rows: settled without the search
    keys = noise_keys(range(60, 60 + len(params)), [1] * len(params))
    temperature, _, dev_keys, greedy = kernel_inputs(logits.to(DEVICE), params, keys)
    top_k = torch.zeros(len(params), dtype=torch.int64, device=DEVICE)
    top_p = torch.tensor([p.top_p for p in params], device=DEVICE)
    truncating = torch.ones(len(params), dtype=torch.bool, device=DEVICE)
    proposed = race_first(logits.to(DEVICE), temperature, top_k, top_p, dev_keys, greedy, truncating,
                          exact=False).cpu()
    exact, winner = _decided_on_the_device(logits, params, keys)
    differs = proposed != exact
    assert differs.any(), "some rows needed the exact search"
    assert torch.equal(proposed[differs], winner[differs])
    assert not differs[16:].any()


def test_race_first_keeps_every_token_tied_at_a_wide_cut():
    """Values on a coarse grid (as bf16 logits are), so hundreds of tokens tie at the cut: the
    exact search finds the cut's value, and the race runs over every token tied with it."""
    from bass.kernels.triton_race_first import _ABOVE_BUFFER

    vocab = 3 * _ABOVE_BUFFER
    torch.manual_seed(17)
    params = [SamplingParams(temperature=1.0, top_p=0.6)] * 12 + [SamplingParams(temperature=1.0, top_k=400)] * 12
    logits = (torch.randn(len(params), vocab) * 0.3 / 0.25).round() * 0.25  # a handful of distinct values
    keys = noise_keys(range(40, 40 + len(params)), [2] * len(params))
    _decided_on_the_device(logits, params, keys)
    scaled = logits  # temperature 1
    cut = truncation_cut(scaled, torch.tensor([p.top_k for p in params]), torch.tensor([p.top_p for p in params]))
    tied = (scaled == cut[:, None]).sum(1)
    assert (tied > _ABOVE_BUFFER // 2).all(), "the cut falls on a crowd of tied values"


def test_race_first_ties_and_pure_top_k():
    """Ties at the cut keep every tied token, as the reference's cut by value does; a pure top-k
    row whose winner falls outside its k is raced again over the k largest."""
    torch.manual_seed(11)
    vocab = 250  # fewer tokens than the buffer holds
    params = [SamplingParams(temperature=1.0, top_p=0.5)] * 16 + [SamplingParams(temperature=1.0, top_k=4)] * 16
    logits = torch.randn(len(params), vocab) * 0.5
    logits[:, :12] = 5.0  # twelve tokens tied at the top hold most of the mass
    logits[16:, 12:40] = 4.9  # top-k rows: many just below the tie
    keys = noise_keys(range(200, 200 + len(params)), range(len(params)))
    got, unrestricted = _decided_on_the_device(logits, params, keys)
    assert (got != unrestricted).any(), "some winners lay outside their cut"


def test_race_first_decides_tail_winners_on_the_device():
    """A winner from a long tail has more tokens above it than the buffer holds; a top-k + top-p
    winner among the k largest leaves the top-k mass unknown. Both are decided on the device,
    from the tokens above the highest threshold that holds every token the cut keeps."""
    from bass.kernels.triton_race_first import _ABOVE_BUFFER

    torch.manual_seed(21)
    vocab = 5000
    nucleus = SamplingParams(temperature=1.0, top_p=0.9)
    both = SamplingParams(temperature=1.0, top_k=20, top_p=0.5)
    params = [nucleus] * 48 + [both] * 48
    logits = torch.randn(len(params), vocab)
    logits[:48, :10] += 9.0  # a head of ten tokens holds ~90% of the mass; the tail the rest
    logits[48:] *= 2.0
    logits[48:, :10] += 9.0
    keys = noise_keys(range(300, 300 + len(params)), range(len(params)))
    got, winner = _decided_on_the_device(logits, params, keys)
    above = (logits > logits.gather(1, winner[:, None])).sum(1)
    outside = got != winner
    assert (outside[:48] & (above[:48] > _ABOVE_BUFFER)).any(), "tail winners with a crowd above them"
    assert (outside[48:] & (above[48:] < 20)).any(), "top-k winners whose top-p share was unknown"


def test_race_first_rows_do_not_depend_on_the_batch():
    torch.manual_seed(5)
    params = SETTINGS + [SamplingParams(temperature=1.0, top_p=0.3)]
    logits = (torch.randn(len(params), 3000) * 1.5).to(DEVICE)
    keys = noise_keys(range(len(params)), [9] * len(params))
    together = _race_first(logits, params, keys)
    for i in range(len(params)):
        alone = _race_first(logits[i:i + 1], params[i:i + 1], keys[i:i + 1])
        assert alone.item() == together[i].item()


def test_race_first_answers_a_token_id_for_rows_of_nan():
    """A captured graph's padding rows may hold NaN logits: their winners must still be token
    ids (a later embedding of an id past the vocabulary is a device-side assert)."""
    torch.manual_seed(2)
    vocab = 3000  # a partial last block
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=4)]
    logits = torch.full((len(params), vocab), float("nan"))
    keys = noise_keys(range(len(params)), [1] * len(params))
    got = _race_first(logits.to(DEVICE), params, keys)
    assert ((got >= 0) & (got < vocab)).all()
    partly = torch.randn(len(params), vocab)
    partly[:, 5:] = float("nan")
    got = _race_first(partly.to(DEVICE), params, keys)
    assert ((got >= 0) & (got < vocab)).all()


@pytest.mark.parametrize("top_k", [0, 600])
def test_the_exact_rounds_end_where_masses_are_nan(top_k):
    """The exact rounds run a bounded number of passes whatever the row holds: with a NaN
    log-sum-exp (masses NaN, so no round finds its winner kept, and the search's tests all
    fail) the kernel still ends, with a token id. A loop that never ended would hang a CUDA
    graph; a token past the vocabulary, a later embedding."""
    from bass.kernels import triton_attention, triton_race_first as rf

    if triton_attention._INTERPRETED:  # loop bounds from tensors (race_first applies it too)
        triton_attention._patch_interpreter_index()
    vocab = 1000
    logits = (torch.randn(2, vocab) * 0.01).to(DEVICE)
    stats = torch.tensor([[float("nan"), float(logits[i].max()), float(logits[i].min()), float("inf")]
                          for i in range(2)], device=DEVICE)
    token = torch.full((2,), -1, dtype=torch.int64, device=DEVICE)
    rf._exact_cut_kernel[(2,)](logits, torch.ones(2, device=DEVICE), torch.tensor([5, 6], device=DEVICE),
                               torch.tensor([top_k, top_k], device=DEVICE), torch.tensor([0.5, 0.5], device=DEVICE),
                               stats, torch.tensor([1, 0], dtype=torch.int8, device=DEVICE), token, vocab,
                               logits.stride(0), -(-vocab // rf._BLOCK), BLOCK=rf._BLOCK, WAYS=rf._WAYS,
                               ROUNDS=rf._ROUNDS)
    token = token.cpu()
    assert 0 <= token[0] < vocab
    assert token[1] == -1, "a row not marked is left alone"
