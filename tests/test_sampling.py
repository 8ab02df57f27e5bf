import numpy as np
import pytest
import torch
from scipy import stats as sps

from bass.config import SamplingParams
from bass.engine.sampling import (ACCEPT_TEST, DRAFT_SAMPLE, TARGET_SAMPLE, RowParams, compact, compact_shaped,
                                  keyed_uniform, sample_from, seed_key_tensor, shape_probs)
from stats import chi_square_pvalue


def test_keyed_uniform_is_a_pure_function_of_key_position_purpose():
    keys = seed_key_tensor([1, 2, (1 << 64) - 1], "cpu")[:, None]
    pos = torch.arange(1000)[None, :]
    u = keyed_uniform(keys, pos, DRAFT_SAMPLE)
    assert u.shape == (3, 1000) and u.dtype == torch.float32
    assert torch.equal(u, keyed_uniform(keys, pos, DRAFT_SAMPLE))
    assert ((u > 0) & (u < 1)).all()
    # Same position, other key or purpose: different draws.
    assert (u[0] != u[1]).float().mean() > 0.99
    assert (u != keyed_uniform(keys, pos, ACCEPT_TEST)).float().mean() > 0.99
    # A row does not depend on which other rows are computed with it.
    assert torch.equal(keyed_uniform(keys[1:2], pos, DRAFT_SAMPLE), u[1:2])


def test_keyed_uniform_is_uniform_and_uncorrelated():
    keys = seed_key_tensor(list(range(200)), "cpu")[:, None]
    u = keyed_uniform(keys, torch.arange(500)[None, :], TARGET_SAMPLE)
    assert sps.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    # neighbouring positions and neighbouring keys are uncorrelated
    assert abs(np.corrcoef(u[:, :-1].flatten(), u[:, 1:].flatten())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:-1].flatten(), u[1:].flatten())[0, 1]) < 0.02


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


def test_sample_from_follows_the_distribution_and_skips_zeros():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    samples = sample_from(probs.expand(20000, -1), u)
    assert chi_square_pvalue(samples.numpy(), probs.numpy()) > 1e-3
    assert not ((samples == 1) | (samples == 4)).any()


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
