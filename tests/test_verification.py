"""The verifier as a pure function: exactness (chi-square), full acceptance, greedy equivalence."""

import pytest
import torch

from bass.engine.sampling import compact, sample_from
from bass.engine.verification import verify_drafts, verify_greedy
from stats import chi_square_pvalue

V, K = 6, 3


def run_verifier(p_rows, q_full, trials, top_n=V, seed=0):
    """Simulate draft sampling from compact q, then verify; p_rows [K+1, V], q_full [K, V]."""
    g = torch.Generator().manual_seed(seed)
    q_ids, q_probs = compact(q_full, top_n)  # [K, N]
    q_ids, q_probs = q_ids.expand(trials, -1, -1), q_probs.expand(trials, -1, -1)
    u_draft = torch.rand(trials, K, generator=g)
    pick = torch.stack([sample_from(q_probs[:, j], u_draft[:, j]) for j in range(K)], 1)
    drafts = q_ids.gather(-1, pick[..., None]).squeeze(-1)
    p = p_rows.expand(trials, -1, -1)
    lens = torch.full((trials,), K)
    return verify_drafts(p, drafts, lens, q_ids, q_probs, torch.rand(trials, K, generator=g),
                         torch.rand(trials, K + 1, generator=g))


def random_dist(shape, seed, sharpness=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(shape, generator=g) * sharpness, -1)


P = random_dist((K + 1, V), 1, sharpness=1.5)
DRAFTS = {
    "good": 0.8 * P[:K] + 0.2 * random_dist((K, V), 2),
    "bad": random_dist((K, V), 3, sharpness=3.0),
    "adversarial": torch.softmax(-4 * P[:K].log(), -1),  # puts its mass where p has least
}


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("top_n", [V, 3])
def test_emitted_tokens_follow_p_at_every_position(draft, top_n):
    accepted, tokens = run_verifier(P, DRAFTS[draft], trials=40000, top_n=top_n)
    checked = 0
    for j in range(K + 1):
        reached = accepted >= j  # token j was emitted; given the accepted prefix it must follow p_j
        if reached.sum() < 500:  # too few to test (a bad draft rarely gets this far)
            continue
        pval = chi_square_pvalue(tokens[reached, j].numpy(), P[j].numpy())
        assert pval > 1e-4, f"position {j}: p-value {pval}"
        checked += 1
    assert checked >= 2


def test_draft_equal_to_target_accepts_everything():
    accepted, _ = run_verifier(P, P[:K], trials=5000)
    assert (accepted == K).all()


def test_acceptance_rate_is_one_minus_total_variation():
    q = DRAFTS["good"]
    accepted, _ = run_verifier(P, q, trials=40000)
    expected_first = (torch.minimum(P[0], q[0])).sum()
    observed_first = (accepted >= 1).float().mean()
    assert abs(observed_first - expected_first) < 0.01


def test_greedy_fast_path_matches_general_path_on_one_hot():
    g = torch.Generator().manual_seed(0)
    B, vocab = 200, 5
    target_argmax = torch.randint(0, vocab, (B, K + 1), generator=g)
    drafts = torch.where(torch.rand(B, K, generator=g) < 0.7, target_argmax[:, :K],
                         torch.randint(0, vocab, (B, K), generator=g))
    lens = torch.randint(0, K + 1, (B,), generator=g)
    p = torch.nn.functional.one_hot(target_argmax, vocab).float()
    got = verify_drafts(p, drafts, lens, drafts[..., None], torch.ones(B, K, 1), torch.rand(B, K, generator=g),
                        torch.rand(B, K + 1, generator=g))
    want = verify_greedy(target_argmax, drafts, lens)
    assert torch.equal(got[0], want[0])
    for b in range(B):
        a = int(want[0][b])
        assert got[1][b, :a + 1].tolist() == want[1][b, :a + 1].tolist()
        assert want[1][b, :a].tolist() == drafts[b, :a].tolist()
        assert want[1][b, a] == target_argmax[b, a]
        assert a == lens[b] or drafts[b, a] != target_argmax[b, a]


def test_no_drafts_is_plain_sampling():
    p = P[:1].expand(30000, 1, V)
    u = torch.rand(30000, 1, generator=torch.Generator().manual_seed(4))
    accepted, tokens = verify_drafts(p, torch.zeros(30000, 0, dtype=torch.int64), torch.zeros(30000, dtype=torch.int64),
                                     torch.zeros(30000, 0, 1, dtype=torch.int64), torch.zeros(30000, 0, 1),
                                     torch.zeros(30000, 0), u)
    assert (accepted == 0).all() and tokens.shape == (30000, 1)
    assert chi_square_pvalue(tokens[:, 0].numpy(), P[0].numpy()) > 1e-4


def test_ragged_draft_lengths_are_respected():
    """Sequences with fewer drafts than the batch maximum ignore the padding columns."""
    p = P.expand(3, -1, -1)
    drafts = torch.tensor([[0, 1, 2], [3, 3, 3], [4, 4, 4]])
    lens = torch.tensor([3, 1, 0])
    q_ids = drafts[..., None]
    accepted, tokens = verify_drafts(p, drafts, lens, q_ids, torch.ones(3, K, 1), torch.zeros(3, K) + 1e-9,
                                     torch.full((3, K + 1), 0.5))
    # u ~ 0 accepts any draft token with p > 0, but never past each sequence's length
    assert accepted.tolist() == [3, 1, 0]
