"""Verification as a pure function, with the Gumbel race deciding every position: exactness
(chi-square, for good, bad and adversarial drafts), full acceptance of a perfect draft, the
acceptance rate the coupling predicts, and ragged draft lengths."""

import pytest
import torch

from bass.app.bench.acceptance_rules import rule_acceptance
from bass.core.config import SamplingParams
from bass.engine.sampling import RowParams, compact, noise_keys, race
from bass.engine.verification import accept_matching_prefix
from stats import chi_square_pvalue

V, K = 6, 3


def random_dist(shape, seed, sharpness=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(shape, generator=g) * sharpness, -1)


P = random_dist((K + 1, V), 1, sharpness=1.5)
DRAFTS = {
    "good": 0.8 * P[:K] + 0.2 * random_dist((K, V), 2),
    "bad": random_dist((K, V), 3, sharpness=3.0),
    "adversarial": torch.softmax(-4 * P[:K].log(), -1),  # puts its mass where p has least
}


def run_step(p_rows, q_full, trials, top_n=V, first_seed=0):
    """One speculative step for `trials` independent sequences (one seed each) at positions
    0..K: the draft races over its compact q (its top_n tokens), the target over p, both with
    the same keyed noise; returns (accepted, tokens, target_tokens)."""
    seeds = list(range(first_seed, first_seed + trials))
    rows = RowParams.build([SamplingParams(temperature=1.0)] * trials, "cpu")
    q_ids, q_probs = compact(q_full, top_n)  # [K, N]
    q_log = torch.zeros_like(q_full).scatter_(-1, q_ids, q_probs).log()  # -inf off the draft's support
    drafts = torch.stack([race(q_log[j].expand(trials, -1), rows, noise_keys(seeds, [j] * trials))
                          for j in range(K)], 1)
    target = torch.stack([race(p_rows[j].log().expand(trials, -1), rows, noise_keys(seeds, [j] * trials))
                          for j in range(K + 1)], 1)
    accepted, tokens = accept_matching_prefix(target, drafts, torch.full((trials,), K))
    return accepted, tokens, target


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("top_n", [V, 3])
def test_emitted_tokens_follow_p_at_every_position(draft, top_n):
    accepted, tokens, target = run_step(P, DRAFTS[draft], trials=40000, top_n=top_n)
    checked = 0
    for j in range(K + 1):
        reached = accepted >= j  # token j was emitted; given the accepted prefix it must follow p_j
        assert torch.equal(tokens[reached, j], target[reached, j])
        if reached.sum() < 500:  # too few to test (a bad draft rarely gets this far)
            continue
        pval = chi_square_pvalue(tokens[reached, j].numpy(), P[j].numpy())
        assert pval > 1e-4, f"position {j}: p-value {pval}"
        checked += 1
    assert checked >= 2


def test_draft_equal_to_target_accepts_everything():
    accepted, _, _ = run_step(P, P[:K], trials=5000)
    assert (accepted == K).float().mean() > 0.999  # float rounding may split a near-tie


def test_acceptance_rate_is_what_the_coupling_predicts():
    q = DRAFTS["good"]
    accepted, _, _ = run_step(P, q, trials=40000, first_seed=10**6)
    q_ids, q_probs = compact(q[:1], V)
    standard, gumbel = rule_acceptance(P[:1], q_ids, q_probs)
    observed_first = (accepted >= 1).double().mean().item()
    assert abs(observed_first - gumbel.item()) < 0.01
    assert gumbel.item() <= standard.item() + 1e-9  # never above 1 - TV


def test_matching_prefix_greedy_semantics():
    g = torch.Generator().manual_seed(0)
    B, vocab = 200, 5
    target = torch.randint(0, vocab, (B, K + 1), generator=g)
    drafts = torch.where(torch.rand(B, K, generator=g) < 0.7, target[:, :K], torch.randint(0, vocab, (B, K), generator=g))
    lens = torch.randint(0, K + 1, (B,), generator=g)
    accepted, tokens = accept_matching_prefix(target, drafts, lens)
    for b in range(B):
        a = int(accepted[b])
        assert a <= lens[b]
        assert tokens[b, :a].tolist() == drafts[b, :a].tolist()
        assert tokens[b, a] == target[b, a]
        assert a == lens[b] or drafts[b, a] != target[b, a]


def test_no_drafts_emits_the_targets_token():
    target = torch.tensor([[3], [1]])
    accepted, tokens = accept_matching_prefix(target, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    assert accepted.tolist() == [0, 0] and tokens[:, 0].tolist() == [3, 1]


def test_ragged_draft_lengths_are_respected():
    """Sequences with fewer drafts than the batch maximum ignore the padding columns."""
    target = torch.tensor([[0, 1, 2, 5], [3, 3, 3, 5], [4, 4, 4, 5]])
    drafts = torch.tensor([[0, 1, 2], [3, 3, 3], [4, 4, 4]])
    accepted, tokens = accept_matching_prefix(target, drafts, torch.tensor([3, 1, 0]))
    assert accepted.tolist() == [3, 1, 0]
    assert [tokens[b, a].item() for b, a in enumerate(accepted.tolist())] == [5, 3, 4]
