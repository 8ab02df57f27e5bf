"""`bass bench acceptance` on tiny models: the numbers it reports mean what they say."""

import json

import pytest
from click.testing import CliRunner

from bass.app.humaneval_problems import load_problems, select
from bass.cli import main


def test_humaneval_problems_load_and_select():
    problems = load_problems()
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    assert [p["task_id"] for p in select(problems, "2:4")] == ["HumanEval/2", "HumanEval/3"]
    assert [p["task_id"] for p in select(problems, "5,1")] == ["HumanEval/5", "HumanEval/1"]


@pytest.mark.parametrize("same_model", [True, False])
def test_acceptance_bench_reports_consistent_numbers(llama_target, llama_draft, tmp_path, same_model):
    out = tmp_path / "acc.json"
    draft = llama_target if same_model else llama_draft
    result = CliRunner().invoke(main, ["bench", "acceptance", "--target", str(llama_target), "--draft", str(draft),
                                       "--problems", "0:2", "-n", "2", "--max-new-tokens", "6", "--draft-lengths",
                                       "3,0", "--modes", "greedy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["environment"]["device"] == "cpu" and data["environment"]["commit"]
    spec, regular = data["results"]
    assert spec["generated_tokens"] == regular["generated_tokens"] == 2 * 2 * 6
    assert regular["draft_tokens"] == 0 and regular["tokens_per_sequence_step"] == 1.0
    if same_model:
        assert spec["acceptance_rate"] == 1.0 and spec["tokens_per_sequence_step"] > 2
    else:
        assert 0 <= spec["acceptance_rate"] < 1
    assert spec["token_acceptance"] >= spec["acceptance_rate"]
