"""HumanEval Pass@First and Pass@All within a time budget, through the Generation service.

For each problem the service is asked for n sequences with a time budget; the sequences that
finished within it (stop or length) are run in the sandbox in the order they finished.
Pass@First: the first to finish passes. Pass@All: any finished one passes. pass@1: the mean
over all finished sequences. Speculative and regular decoding run at the same budgets.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bass.app.evaluation.sandbox import SandboxLimits, humaneval_program, run_program

# Where a completion of a HumanEval function ends (the usual stop sequences).
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert "]
FINISHED = ("stop", "length")


@dataclass(frozen=True)
class ProblemScore:
    task_id: str
    finished: int
    passed: int
    pass_first: bool
    pass_all: bool
    seconds: float


def score(problem: dict, sequences: list[tuple[int, str, str]], seconds: float, limits: SandboxLimits,
          pool: ThreadPoolExecutor) -> ProblemScore:
    """sequences: (finish_order, finish_reason, text); those that did not finish are ignored."""
    done = sorted((s for s in sequences if s[1] in FINISHED), key=lambda s: s[0])
    outcomes = list(pool.map(lambda s: run_program(humaneval_program(problem, s[2]), limits), done))
    return ProblemScore(task_id=problem["task_id"], finished=len(done), passed=sum(o.passed for o in outcomes),
                        pass_first=bool(outcomes) and outcomes[0].passed, pass_all=any(o.passed for o in outcomes),
                        seconds=seconds)


def summarize(scores: list[ProblemScore], n: int) -> dict:
    finished = sum(s.finished for s in scores)
    return {"problems": len(scores), "pass_at_first": round(statistics.mean(s.pass_first for s in scores), 4),
            "pass_at_all": round(statistics.mean(s.pass_all for s in scores), 4),
            "pass_at_1_over_finished": round(sum(s.passed for s in scores) / finished, 4) if finished else None,
            "finished_per_problem": round(finished / len(scores), 3), "n": n,
            "seconds_per_problem": round(statistics.mean(s.seconds for s in scores), 3)}


def evaluate(address: str, problems: list[dict], *, n: int, budgets_ms: list[int], modes: list[str],
             temperature: float, top_p: float, max_new_tokens: int, limits: SandboxLimits = SandboxLimits(),
             sandbox_workers: int = 2, progress=None) -> list[dict]:
    """Requests go one at a time (each alone in the service, so its budget is its own); the
    completions of one problem run in the sandbox while the next problem generates."""
    from bass.app.client import FINISH_REASON_NAMES, BassClient

    rows = []
    with (BassClient(address, timeout_s=3600) as client, ThreadPoolExecutor(max_workers=sandbox_workers) as sandbox,
          ThreadPoolExecutor(max_workers=2) as scoring):
        for mode in modes:
            for budget in budgets_ms:
                pending = []
                for i, p in enumerate(problems):
                    t0 = time.perf_counter()
                    r = client.generate(p["prompt"], n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=top_p, stop=STOP, time_budget_ms=budget,
                                        speculate=(mode == "speculative"))
                    seconds = time.perf_counter() - t0
                    seqs = [(s.finish_order, FINISH_REASON_NAMES[s.finish_reason], s.text) for s in r.sequences]
                    pending.append(scoring.submit(score, p, seqs, seconds, limits, sandbox))
                    if progress:
                        progress(f"{mode} budget {budget} ms: {i + 1}/{len(problems)}")
                scores = [f.result() for f in pending]
                rows.append({"mode": mode, "time_budget_ms": budget, **summarize(scores, n),
                             "per_problem": [s.__dict__ for s in scores]})
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = ["| mode | budget (ms) | Pass@First | Pass@All | pass@1 (finished) | finished / problem | s / problem |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['time_budget_ms']} | {r['pass_at_first']:.3f} | {r['pass_at_all']:.3f} | "
                     f"{r['pass_at_1_over_finished'] if r['pass_at_1_over_finished'] is not None else '-'} | "
                     f"{r['finished_per_problem']} | {r['seconds_per_problem']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, style in (("speculative", "-"), ("regular", "--")):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["time_budget_ms"])
        if not mine:
            continue
        budgets = [r["time_budget_ms"] for r in mine]
        ax.plot(budgets, [r["pass_at_first"] for r in mine], style + "o", label=f"{mode} Pass@First")
        ax.plot(budgets, [r["pass_at_all"] for r in mine], style + "s", label=f"{mode} Pass@All")
    ax.set_xlabel("time budget per request (ms)")
    ax.set_ylabel("fraction of problems")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
