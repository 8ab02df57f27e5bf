"""The bundled pair (Qwen2.5-Coder 0.5B draft / 1.5B target), where `make models` has run.

Skipped when the converted models are absent (they are ~5 GB; `make models` fetches them).
On the CPU in fp32 our runtime must match transformers token for token.
"""

import gc

import pytest
import torch

from bass.app.humaneval_problems import load_problems
from bass.app.models.fetch import default_model_dirs
from bass.coordinator.requests import GenerationRequest
from bass.core.config import RunnerConfig
from bass.core.worker_api import AddSequence
from bass.engine.runner import ModelRunner
from conftest import build_scheduler

DRAFT_DIR, TARGET_DIR = default_model_dirs()
pytestmark = pytest.mark.skipif(not (TARGET_DIR / "config.json").is_file() or not (DRAFT_DIR / "config.json").is_file(),
                                reason="model pair absent: run `make models`")
NEW_TOKENS = 12


@pytest.fixture(scope="module", autouse=True)
def _every_core(torch_default_threads):
    """Real models: torch's own thread count, not the tiny models' one (conftest)."""


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TARGET_DIR))
    problems = load_problems()
    return [tuple(tok.encode(problems[i]["prompt"])) for i in (0, 2, 11)]


def hf_greedy(model_dir, prompts, logits_of=None):
    """transformers' greedy continuations of `prompts`; with `logits_of` (ids), also its logits
    for those ids, from the same load of the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            out.append(ids[0, len(p):].tolist())
        logits = None if logits_of is None else model(torch.tensor([logits_of])).logits[0]
    del model
    gc.collect()
    return out if logits_of is None else (out, logits)


def prefill_ids(prompts):
    return prompts[0][:64]


@pytest.fixture(scope="module")
def target_hf(prompts):
    """The 1.5 B target in transformers, loaded once for both tests that compare with it: its
    greedy continuations of the prompts and its logits for prefill_ids."""
    return hf_greedy(TARGET_DIR, prompts, logits_of=prefill_ids(prompts))


@pytest.fixture(scope="module")
def target_reference(target_hf):
    return target_hf[0]


def test_draft_runtime_matches_transformers(prompts):
    expected = hf_greedy(DRAFT_DIR, prompts)
    results = build_scheduler(DRAFT_DIR, None, max_seq_len=512, num_slots=4).generate(
        [GenerationRequest(prompt_ids=p, max_new_tokens=NEW_TOKENS) for p in prompts])
    assert [r.sequences[0].token_ids for r in results] == expected


def test_speculative_pair_matches_transformers_target(prompts, target_reference):
    results = build_scheduler(TARGET_DIR, DRAFT_DIR, "bass", max_seq_len=512, num_slots=4).generate(
        [GenerationRequest(prompt_ids=p, max_new_tokens=NEW_TOKENS) for p in prompts])
    assert [r.sequences[0].token_ids for r in results] == target_reference
    accepted = sum(r.stats.accepted_tokens for r in results)
    proposed = sum(r.stats.draft_tokens for r in results)
    assert proposed > 0 and accepted / proposed > 0.3, "the real draft should agree with its target often"


def test_prefill_logits_match_transformers(prompts, target_hf):
    ids = prefill_ids(prompts)
    runner = ModelRunner(RunnerConfig(model_dir=TARGET_DIR, num_slots=1, max_seq_len=128))
    runner.add([AddSequence(1, ids[:1])])
    state = runner.get(1)
    runner.commit(state, list(ids[1:]))
    ours = runner.forward([(state, [])], [len(ids)])
    del runner
    ref = target_hf[1]  # transformers' logits for the same ids
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-3)
