"""bass bench invariance: its comparison logic, and a run on tiny models on the CPU (fp32, where
the text must not depend on the batch or the draft length at all)."""

import json

from click.testing import CliRunner

from bass.app.bench.invariance import compare, first_difference
from bass.cli import main


def test_first_difference_and_compare():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert compare([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]]) == {
        "sequences": 3, "differ": 2, "first_difference_positions": [0, 1]}


def test_cli_on_tiny_models(llama_target, llama_draft, tmp_path, monkeypatch):
    monkeypatch.setenv("BASS_HUMANEVAL", str(_tiny_humaneval(tmp_path)))
    out = tmp_path / "inv.json"
    result = CliRunner().invoke(main, ["bench", "invariance", "--target", str(llama_target), "--draft",
                                       str(llama_draft), "--problems", "0:4", "--max-new-tokens", "10",
                                       "--policies", "0,3,auto", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in rows] == ["greedy", "t0.8-p0.95"]
    for row in rows:
        assert set(row["runs"]) == {"batch of 4, policy 0", "alone, policy 3", "batch of 4, policy 3",
                                    "alone, policy auto", "batch of 4, policy auto"}
        assert all(run["sequences"] == 4 and run["differ"] == 0 for run in row["runs"].values()), row


def _tiny_humaneval(tmp_path):
    import gzip

    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i, prompt in enumerate(["def add(a, b):", "import os\n", "class A:", "x = [1, 2"]):
            f.write(json.dumps({"task_id": f"t/{i}", "prompt": prompt, "test": "", "entry_point": "f"}) + "\n")
    return path
