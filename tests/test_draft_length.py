from bass.config import DraftLengthConfig
from bass.coordinator.draft_length import BassRule, FixedLength, PerSequenceAdaptive, make_policy


def test_bass_rule_follows_the_paper():
    rule = BassRule(initial=7, max_length=32)
    assert rule.lengths([1, 2]) == [7, 7]
    rule.observe([1, 2], [7, 7], [7, 3])  # someone accepted all: +2
    assert rule.length == 9 and rule.shrink == 0
    rule.observe([1, 2], [9, 9], [2, 4])  # nobody did: max(1, 4, 9 - ceil(0.9) - 0) = 8, s = 1
    assert rule.length == 8 and rule.shrink == 1
    rule.observe([1, 2], [8, 8], [1, 0])  # max(1, 1, 8 - 1 - 1) = 6
    assert rule.length == 6
    rule.observe([1, 2], [6, 6], [5, 5])  # longest run wins: max(1, 5, 6 - 1 - 1) = 5
    assert rule.length == 5
    for _ in range(40):
        rule.observe([1], [rule.length], [rule.length])
    assert rule.length == 32
    for _ in range(80):
        rule.observe([1], [rule.length], [0])
    assert rule.length == 1


def test_bass_rule_ignores_sequences_that_did_not_draft():
    rule = BassRule()
    rule.observe([1, 2], [0, 0], [0, 0])
    assert rule.length == 7


def test_adaptive_lengths_follow_each_sequence_acceptance():
    pol = PerSequenceAdaptive(cost_ratio=0.3, max_length=16)
    for _ in range(20):
        pol.observe([1, 2], [8, 8], [8, 0])
    good, bad = pol.lengths([1, 2])
    assert good >= 8 and bad == 0
    # a sequence that stopped drafting gets another chance once its evidence fades
    for _ in range(30):
        pol.observe([2], [0], [0])
    assert pol.lengths([2])[0] >= 1
    pol.forget(1)
    assert pol.acceptance(1) == pol.prior


def test_adaptive_prefers_no_drafting_when_drafts_are_expensive():
    pol = PerSequenceAdaptive(cost_ratio=1.0, max_length=8)
    assert pol.best_length(0.5) == 0
    assert PerSequenceAdaptive(cost_ratio=0.05, max_length=8).best_length(0.9) == 8


def test_config_parsing():
    assert isinstance(make_policy(DraftLengthConfig.parse("5")), FixedLength)
    assert DraftLengthConfig.parse("0").speculates is False
    assert isinstance(make_policy(DraftLengthConfig.parse("bass")), BassRule)
    assert isinstance(make_policy(DraftLengthConfig.parse("adaptive")), PerSequenceAdaptive)


def test_token_acceptance_counts_only_tested_tokens():
    from bass.coordinator.requests import RequestStats

    # 2 steps of k = 4: accepted 4 (no rejection), then 1 then rejected: alpha = 5 / 6
    stats = RequestStats(steps=2, draft_tokens=8, accepted_tokens=5, rejections=1)
    assert stats.acceptance_rate == 5 / 8 and stats.token_acceptance == 5 / 6
