"""`bass eval humaneval`: scoring rules, and the command end to end through the services."""

import json
from concurrent.futures import ThreadPoolExecutor

from click.testing import CliRunner

from bass.app.evaluation.humaneval import score
from bass.app.evaluation.sandbox import SandboxLimits
from bass.app.humaneval_problems import load_problems
from bass.cli import main
from services import start_services


def test_pass_at_first_follows_finish_order_and_unfinished_sequences_do_not_count():
    problem = load_problems()[2]
    right, wrong = problem["canonical_solution"], "    return -1.0\n"
    seqs = [(2, "stop", right), (1, "length", wrong), (0, "time_budget", right)]
    with ThreadPoolExecutor(2) as pool:
        s = score(problem, seqs, 1.0, SandboxLimits(), pool)
        assert (s.finished, s.passed, s.pass_first, s.pass_all) == (2, 1, False, True)
        s = score(problem, [(1, "stop", right), (2, "stop", wrong)], 1.0, SandboxLimits(), pool)
        assert s.pass_first and s.pass_all
        s = score(problem, [(0, "time_budget", right)], 1.0, SandboxLimits(), pool)
        assert (s.finished, s.pass_first, s.pass_all) == (0, False, False)


def test_eval_command_through_the_services(llama_target, llama_draft, tmp_path):
    services = start_services(llama_target, llama_draft, policy="3")
    try:
        out = tmp_path / "eval"
        result = CliRunner().invoke(main, ["eval", "humaneval", "--address", services.address, "--n", "2",
                                           "--time-budget-ms", "1,60000", "--problems", "2,3", "--max-new-tokens",
                                           "12", "--out", str(out)])
        assert result.exit_code == 0, result.output
    finally:
        services.stop()
    data = json.loads((out / "results.json").read_text())
    rows = {(r["mode"], r["time_budget_ms"]): r for r in data["results"]}
    assert set(rows) == {(m, b) for m in ("speculative", "regular") for b in (1, 60000)}
    for mode in ("speculative", "regular"):
        assert rows[(mode, 60000)]["finished_per_problem"] == 2  # a generous budget: everything finishes
        assert rows[(mode, 1)]["finished_per_problem"] < 2  # 1 ms: the budget cuts sequences off
        for r in (rows[(mode, 1)], rows[(mode, 60000)]):
            assert 0 <= r["pass_at_first"] <= r["pass_at_all"] <= 1 and len(r["per_problem"]) == 2
    assert (out / "results.md").read_text().startswith("| mode |")
    assert (out / "pass_rates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
