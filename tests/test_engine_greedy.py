"""Greedy speculative decoding is token-for-token the target's own greedy decoding."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from bass.coordinator.requests import GenerationRequest
from conftest import build_scheduler

PROMPTS = [(5, 17, 33, 200, 7, 9, 11), (42,), tuple(range(3, 22)), (100, 101)]
NEW_TOKENS = 20


def hf_greedy(model_dir, prompts, max_new_tokens=NEW_TOKENS):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    out = []
    for p in prompts:
        with torch.no_grad():
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False)
        out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, llama_target, llama_draft, qwen_target, qwen_draft):
    target, draft = {"llama": (llama_target, llama_draft), "qwen2": (qwen_target, qwen_draft)}[request.param]
    return target, draft, hf_greedy(target, PROMPTS)


def requests(n=2, **kw):
    return [GenerationRequest(prompt_ids=p, n=n, max_new_tokens=NEW_TOKENS, **kw) for p in PROMPTS]


@pytest.mark.parametrize("policy,attention", [("bass", "pad"), ("auto", "pad"), ("3", "pad"), ("adaptive", "pad"), ("5", "split"),
                                              ("1", "pad")])
def test_speculative_greedy_equals_transformers(pair, policy, attention):
    target, draft, expected = pair
    scheduler = build_scheduler(target, draft, policy, attention=attention)
    results = scheduler.generate(requests())
    for result, want in zip(results, expected):
        for seq in result.sequences:  # n = 2 forks of one prefill
            assert seq.token_ids == want
    total = sum(r.stats.draft_tokens for r in results)
    assert total > 0, "the draft must actually have proposed tokens"


def test_regular_decoding_equals_transformers(pair):
    target, _, expected = pair
    for draft_arg in (None, pair[1]):  # no draft at all, or a draft with length 0
        results = build_scheduler(target, draft_arg, "0").generate(requests())
        assert [r.sequences[0].token_ids for r in results] == expected
        assert all(r.stats.draft_tokens == 0 for r in results)
        assert all(r.stats.steps == NEW_TOKENS for r in results)


def test_per_request_speculation_switch(pair):
    target, draft, expected = pair
    results = build_scheduler(target, draft, "4").generate(
        [GenerationRequest(prompt_ids=p, max_new_tokens=NEW_TOKENS, speculate=(i % 2 == 0))
         for i, p in enumerate(PROMPTS)])
    assert [r.sequences[0].token_ids for r in results] == expected
    assert [r.stats.draft_tokens > 0 for r in results] == [True, False, True, False]


def test_draft_identical_to_target_accepts_every_token(pair):
    target, _, expected = pair
    scheduler = build_scheduler(target, target, "4")
    results = scheduler.generate(requests(n=1))
    assert [r.sequences[0].token_ids for r in results] == expected
    for r in results:
        assert r.stats.acceptance_rate == 1.0 and r.stats.token_acceptance == 1.0 and r.stats.rejections == 0
        assert r.stats.steps == 4  # 20 tokens at up to 5 per step
