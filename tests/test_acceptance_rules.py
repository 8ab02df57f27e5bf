"""The exact acceptance odds used to compare verification rules, against simulation."""

import torch

from bass.app.bench.acceptance_rules import rule_acceptance, tokens_per_step
from bass.engine.sampling import compact


def _random_pair(generator: torch.Generator, vocab: int, top_n: int, sharpness: float):
    p = torch.softmax(sharpness * torch.randn(3, vocab, generator=generator), dim=-1)
    q_full = torch.softmax(sharpness * torch.randn(3, vocab, generator=generator) + torch.log(p) * 0.5, dim=-1)
    q_ids, q_probs = compact(q_full, top_n)
    return p, q_ids, q_probs


def test_identical_distributions_always_accept():
    p = torch.softmax(torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), dim=-1)
    q_ids, q_probs = compact(p, 12)
    standard, gumbel = rule_acceptance(p, q_ids, q_probs)
    assert torch.allclose(standard, torch.ones(4, dtype=torch.float64))
    assert torch.allclose(gumbel, torch.ones(4, dtype=torch.float64))


def test_exact_odds_match_simulated_rules():
    generator = torch.Generator().manual_seed(7)
    vocab, top_n, trials = 10, 6, 200_000
    p, q_ids, q_probs = _random_pair(generator, vocab, top_n, sharpness=1.5)
    standard, gumbel = rule_acceptance(p, q_ids, q_probs)
    q = torch.zeros_like(p).scatter_(-1, q_ids, q_probs)
    for r in range(p.shape[0]):
        # Standard rule: d ~ q, accept with min(1, p(d) / q(d)).
        d = torch.multinomial(q[r], trials, replacement=True, generator=generator)
        accept = torch.rand(trials, generator=generator) < (p[r, d] / q[r, d]).clamp(max=1)
        assert abs(accept.double().mean().item() - standard[r].item()) < 4e-3
        # Gumbel coupling: shared noise per token, accept iff both argmaxes agree.
        g = -torch.log(-torch.log(torch.rand(trials, vocab, generator=generator)))
        target_token = (torch.log(p[r]) + g).argmax(-1)
        draft_token = (torch.log(q[r]) + g).argmax(-1)  # log 0 = -inf: never outside q's support
        agree = (target_token == draft_token).double().mean().item()
        assert abs(agree - gumbel[r].item()) < 4e-3
        # The coupling bound from the drafter-invariance literature: (1 - TV) / (1 + TV) <= gumbel <= 1 - TV.
        tv = 1 - standard[r].item()
        assert (1 - tv) / (1 + tv) - 1e-9 <= gumbel[r].item() <= standard[r].item() + 1e-9


def test_tokens_per_step():
    assert tokens_per_step(1.0, 4) == 5.0
    assert abs(tokens_per_step(0.5, 2) - 1.75) < 1e-12
    assert tokens_per_step(0.0, 8) == 1.0


def test_measure_on_tiny_models(llama_target, llama_draft):
    """End to end: a draft identical to the target accepts everything under both rules; a
    different draft less, the coupling never above the standard rule."""
    from bass.app.bench.acceptance_rules import measure
    from bass.core.config import RunnerConfig, SamplingParams

    def cfg(d):
        return RunnerConfig(model_dir=d, num_slots=8, max_seq_len=128, attention="pad")

    modes = {"t1": SamplingParams(temperature=1.0, top_p=0.95)}
    prompts = ["def f(x):", "hello world", "import os"]
    # The window covers the whole (flat, random) vocabulary, so q is exactly p.
    same = measure(cfg(llama_target), cfg(llama_target), prompts, n=2, max_new_tokens=6, modes=modes, batch_prompts=2,
                   score_batch=3, draft_top_n=1 << 20)[0]
    assert same["positions"] == 3 * 2 * 6
    assert same["alpha_standard"] > 0.999 and same["alpha_gumbel"] > 0.999
    other = measure(cfg(llama_target), cfg(llama_draft), prompts, n=2, max_new_tokens=6, modes=modes,
                    batch_prompts=2, draft_vocabs=(0, 16))[0]
    assert 0 <= other["alpha_gumbel"] <= other["alpha_standard"] < 0.999
    # A draft that can only propose ids < 16 loses what the target puts on the others.
    assert other["n"] == 2
    small = other["draft_vocab"]["16"]
    assert small["positions"] == other["positions"] and small["alpha_standard"] < other["alpha_standard"]


def test_cli_writes_both_rules_per_mode_and_draft_vocabulary(llama_target, llama_draft, tmp_path, monkeypatch):
    import gzip
    import json

    from click.testing import CliRunner

    from bass.cli import main

    data = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for i, prompt in enumerate(["def add(a, b):", "import os\n"]):
            f.write(json.dumps({"task_id": f"t/{i}", "prompt": prompt, "test": "", "entry_point": "f"}) + "\n")
    monkeypatch.setenv("BASS_HUMANEVAL", str(data))
    out = tmp_path / "rules.json"
    result = CliRunner().invoke(main, ["bench", "acceptance-rules", "--target", str(llama_target), "--draft",
                                       str(llama_draft), "--problems", "0:2", "-n", "2", "--max-new-tokens", "5",
                                       "--draft-vocabs", "0,32", "--batch-prompts", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in rows] == ["t0.8-p0.95", "t0.2-p0.95"]
    for r in rows:
        assert r["positions"] == 2 * 2 * 5 and set(r["draft_vocab"]) == {"32"}
        assert 0 <= r["alpha_gumbel"] <= r["alpha_standard"] <= 1
