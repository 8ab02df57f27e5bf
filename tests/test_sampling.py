import numpy as np
import pytest
import torch
from scipy import stats as sps

from bass.core.config import SamplingParams
from bass.engine.sampling import (RowParams, compact, compact_shaped, draft_race, gumbel_noise, noise_keys, race,
                                  race_unsynced, shape_probs, truncation_cut)
from stats import chi_square_pvalue


def test_gumbel_noise_is_a_pure_function_of_key_position_token():
    keys = noise_keys([1, 2, (1 << 64) - 1], [5, 5, 5])
    tokens = torch.arange(1000)[None, :]
    g = gumbel_noise(keys, tokens)
    assert g.shape == (3, 1000) and g.dtype == torch.float32 and torch.isfinite(g).all()
    assert torch.equal(g, gumbel_noise(keys, tokens))
    # Other key, other position: different noise.
    assert (g[0] != g[1]).float().mean() > 0.99
    assert (g[0] != gumbel_noise(noise_keys([1], [6]), tokens)[0]).float().mean() > 0.99
    # A row does not depend on which other rows or tokens are computed with it.
    assert torch.equal(gumbel_noise(keys[1:2], tokens), g[1:2])
    assert torch.equal(gumbel_noise(keys, torch.tensor([[7, 3], [7, 3], [7, 3]])), g[:, [7, 3]])


def test_noise_keys_are_the_lowbias32_chain_of_seed_and_position():
    """The host's NumPy hash is the same chain as the tensor hash (_mix32) that gumbel_noise and
    the Triton race use: (seed low word ^ domain), then the high word, then the position."""
    from bass.engine.sampling import _NOISE_DOMAIN, _mix32

    seeds, positions = [0, 1, (1 << 63) + 5, (1 << 64) - 1, 0xDEADBEEF12345678], [0, 7, 2047, 1 << 20, 5]
    expected = []
    for seed, pos in zip(seeds, positions):
        h = _mix32(torch.tensor([(seed & 0xFFFFFFFF) ^ _NOISE_DOMAIN]))
        h = _mix32(h ^ (seed >> 32))
        expected.append(int(_mix32(h ^ pos)))
    keys = noise_keys(seeds, positions)
    assert keys.dtype == torch.int64 and keys.tolist() == expected


def test_gumbel_noise_is_gumbel_and_uncorrelated():
    g = gumbel_noise(noise_keys(list(range(200)), [3] * 200), torch.arange(500)[None, :])
    assert sps.kstest(g.flatten().numpy(), "gumbel_r").pvalue > 1e-3
    # neighbouring tokens and neighbouring seeds are uncorrelated
    assert abs(np.corrcoef(g[:, :-1].flatten(), g[:, 1:].flatten())[0, 1]) < 0.02
    assert abs(np.corrcoef(g[:-1].flatten(), g[1:].flatten())[0, 1]) < 0.02


def rows(*params):
    return RowParams.build(list(params), "cpu")


def test_shape_probs_temperature_topk_topp_and_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    out = shape_probs(logits, rows(SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
                                   SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=0.0)))
    torch.testing.assert_close(out.sum(-1), torch.ones(4))
    torch.testing.assert_close(out[0], torch.softmax(logits[0] / 0.7, -1))
    # top-k: exactly the 5 largest, renormalized
    top5 = logits[1].topk(5).indices
    assert set(out[1].nonzero().flatten().tolist()) == set(top5.tolist())
    torch.testing.assert_close(out[1][top5], torch.softmax(logits[1][top5], -1))
    # top-p: the smallest prefix of the sorted distribution with mass >= 0.5
    p = torch.softmax(logits[2], -1)
    sp, order = p.sort(descending=True)
    keep = int((sp.cumsum(0) < 0.5).sum()) + 1
    assert set(out[2].nonzero().flatten().tolist()) == set(order[:keep].tolist())
    # greedy: one-hot argmax
    assert out[3].max() == 1 and out[3].argmax() == logits[3].argmax()


SETTINGS = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
            SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=1.3, top_k=8, top_p=0.8)]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_race_is_an_exact_sample_of_the_shaped_distribution(params):
    """One row raced under 30,000 seeds: the winners follow shape_probs (chi-square), and a
    token that shaping drops never wins."""
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(3)) * 2
    trials = 30000
    tokens = race(logits.expand(trials, -1), rows(*[params] * trials), noise_keys(range(trials), [9] * trials))
    want = shape_probs(logits, rows(params))[0]
    assert chi_square_pvalue(tokens.numpy(), want.numpy()) > 1e-4


def test_race_rows_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(6, 300)
    params = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(), SamplingParams(temperature=1.2, top_k=9)] * 2
    keys = noise_keys([11, 12, 13, 14, 15, 16], [40, 41, 42, 40, 41, 42])
    together = race(logits, rows(*params), keys)
    alone = torch.cat([race(logits[i:i + 1], rows(params[i]), keys[i:i + 1]) for i in range(6)])
    assert torch.equal(together, alone)
    assert together[1] == logits[1].argmax() and together[4] == logits[4].argmax()  # greedy rows


def test_draft_race_is_the_targets_race_when_the_cut_is_inside_its_window():
    """With the top-k / top-p cut inside the window, the draft's cut is the exact one, so on the
    same logits and keys the draft proposes exactly the target's token; with a window smaller
    than the cut, it proposes only among the window's tokens."""
    torch.manual_seed(4)
    logits = torch.randn(6, 300) * 3
    params = rows(SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.0, top_k=7), SamplingParams(),
                  SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_p=0.6),
                  SamplingParams(temperature=1.2, top_k=3, top_p=0.8))
    for seed in range(20):
        keys = noise_keys([seed * 10 + i for i in range(6)], [5] * 6)
        assert torch.equal(draft_race(logits, params, keys, 300), race(logits, params, keys))
    narrow = rows(*[SamplingParams(temperature=1.0, top_p=0.99)] * 2000)
    picks = draft_race(logits[:1].expand(2000, -1), narrow, noise_keys(range(2000), [1] * 2000), 4)
    assert set(picks.tolist()) <= set(logits[0].topk(4).indices.tolist())


@pytest.mark.parametrize("window", [1, 4, 16, 64])
def test_the_windowed_cut_is_the_sorted_cut_for_every_row(window):
    """The target's cut from a top-k window (rows whose cut lies beyond it sorted whole) equals
    the cut of a full sort, for peaked and flat rows, top-k inside and beyond the window, ties,
    and rows that keep everything; a row's cut is the same alone and in the batch."""
    torch.manual_seed(7)
    vocab = 200
    scale = torch.tensor([0.1, 1.0, 4.0, 12.0]).repeat(6)[:, None]  # flat .. peaked
    scaled = torch.randn(24, vocab) * scale
    scaled[3] = torch.randn(vocab) * 0.1
    scaled[3, :50] = 2.0  # a plateau of ties at the top
    top_k = torch.tensor([0, 0, 0, 3, 0, 50, 0, 0, 5, 0, 300, 0] * 2)
    top_p = torch.tensor([0.95, 0.5, 0.99, 1.0, 0.2, 0.9, 1.0, 0.999, 1.0, 0.6, 0.95, 0.8] * 2)
    want = truncation_cut(scaled, top_k, top_p, window=vocab)
    got = truncation_cut(scaled, top_k, top_p, window=window)
    keeps_all = (top_k == 0) & (top_p >= 1)
    assert torch.equal(got[~keeps_all], want[~keeps_all])
    for row in (0, 3, 10, 17):
        assert torch.equal(truncation_cut(scaled[row:row + 1], top_k[row:row + 1], top_p[row:row + 1], window=window),
                           got[row:row + 1])
    # by rank: the plateau row keeps its top 3 ranks, so every tied token
    assert got[3] == 2.0 and (scaled[3] >= got[3]).sum() == 50


def test_race_unsynced_flags_exactly_the_rows_it_may_get_wrong(monkeypatch):
    """Rows whose cut lies inside the window get race's token; the others are flagged."""
    import bass.engine.sampling as sampling

    monkeypatch.setattr(sampling, "CUT_WINDOW", 16)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 500, generator=gen)
    logits[:6, :3] += 12  # peaked rows: their nucleus is a few tokens
    params = [SamplingParams(temperature=0.8, top_p=0.95)] * 10 + [SamplingParams(), SamplingParams(temperature=1.0)]
    keys = noise_keys(range(12), [4] * 12)
    tokens, redo = race_unsynced(logits, rows(*params), keys)
    assert redo[:6].tolist() == [False] * 6 and redo[6:10].all()  # flat rows: the nucleus is > 16 tokens
    assert not redo[10:].any()  # greedy and untruncated rows need no cut
    exact = race(logits, rows(*params), keys)
    assert torch.equal(tokens[~redo], exact[~redo])
    assert race_unsynced(logits, rows(*[SamplingParams()] * 12), None)[1] is None


def test_top_p_keeps_every_token_tied_at_the_cut():
    """The kept set is a function of the values: tokens tied with the last one kept stay too."""
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, -2.0]])
    probs = shape_probs(logits, rows(SamplingParams(temperature=1.0, top_p=0.75)))  # by rank: 2 tokens
    assert (probs[0, :4] > 0).all() and probs[0, 4] == 0


def test_compact_keeps_top_n_renormalized():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    ids, vals = compact(probs, 2)
    assert ids.tolist() == [[1, 3]]
    torch.testing.assert_close(vals, torch.tensor([[4 / 7, 3 / 7]]))
    ids, vals = compact(probs, 99)
    assert ids.shape == (1, 4)


def _dense(ids: torch.Tensor, probs: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.zeros(ids.shape[0], vocab, dtype=probs.dtype).scatter_add_(-1, ids, probs)


@pytest.mark.parametrize("top_n", [1, 8, 64])
def test_compact_shaped_is_the_compact_of_the_shaped_distribution(top_n):
    """The draft's windowed q (top-k + log-sum-exp, no vocabulary sort) is the same
    distribution as compact(shape_probs(...)) for every mix of settings, the top-p cut
    landing inside the window or beyond it, peaked and flat rows alike."""
    torch.manual_seed(top_n)
    vocab = 500
    settings = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0),
                SamplingParams(temperature=0.3, top_k=5), SamplingParams(temperature=1.3, top_k=40, top_p=0.5),
                SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.2),
                SamplingParams(temperature=2.0, top_k=top_n, top_p=0.9)]
    for scale in (0.5, 3.0, 10.0):  # flat to peaked
        logits = torch.randn(len(settings), vocab) * scale
        params = rows(*settings)
        ids, probs = compact_shaped(logits, params, top_n)
        assert ids.shape == probs.shape == (len(settings), top_n)
        want = _dense(*compact(shape_probs(logits, params), top_n), vocab)
        torch.testing.assert_close(_dense(ids, probs, vocab), want, atol=1e-6, rtol=1e-4)
        # a top_k beyond the window takes the full path and still agrees
        wide = rows(SamplingParams(temperature=1.0, top_k=top_n + 1, top_p=0.9), *settings[1:])
        torch.testing.assert_close(_dense(*compact_shaped(logits, wide, top_n), vocab),
                                   _dense(*compact(shape_probs(logits, wide), top_n), vocab))


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(top_k=-1)])
def test_sampling_params_validate(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_compact_shaped_keeps_ties_like_the_full_path():
    """bf16-rounded logits tie often; a top-k cut through a run of equal values keeps all of
    them in both paths (the set is a function of the values, not of a sort's tie order)."""
    torch.manual_seed(0)
    logits = (torch.randn(8, 5000) * 4).to(torch.bfloat16).float()
    params = rows(*[SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=20),
                    SamplingParams(temperature=0.0), SamplingParams(temperature=0.6, top_p=0.5)] * 2)
    want = _dense(*compact(shape_probs(logits, params), 64), 5000)
    got = _dense(*compact_shaped(logits, params, 64), 5000)
    torch.testing.assert_close(got.sort(-1, descending=True).values, want.sort(-1, descending=True).values,
                               atol=1e-6, rtol=1e-4)
