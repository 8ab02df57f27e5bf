"""Quality evaluations through a running service: `bass eval humaneval`."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("eval")
def eval_group() -> None:
    """Quality evaluations through a running service."""


@eval_group.command("humaneval")
@click.option("--address", default="127.0.0.1:50051", show_default=True)
@click.option("--n", "n", default=8, show_default=True, help="Sequences per problem.")
@click.option("--time-budget-ms", "budgets", default="2000", show_default=True, help="Comma-separated budgets.")
@click.option("--problems", default="all", show_default=True, help="'all', '0:16' or '1,5,9'.")
@click.option("--modes", default="speculative,regular", show_default=True)
@click.option("--temperature", default=0.8, show_default=True, help="0 with --n 1 for greedy.")
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--max-new-tokens", default=384, show_default=True)
@click.option("--timeout-s", default=10.0, show_default=True, help="Sandbox wall-clock limit per completion.")
@click.option("--sandbox-workers", default=2, show_default=True,
              help="Completions run at once (keep it below the free cores, so that scoring does not slow the service).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write results.json, results.md, pass_rates.png.")
def eval_humaneval(address, n, budgets, problems, modes, temperature, top_p, max_new_tokens, timeout_s, sandbox_workers,
                   out_dir) -> None:
    """HumanEval Pass@First / Pass@All within time budgets, speculative vs regular, run in a sandbox."""
    from bass.app.bench.environment import describe
    from bass.app.evaluation.humaneval import evaluate, markdown_table, plot
    from bass.app.evaluation.sandbox import SandboxLimits
    from bass.app.humaneval_problems import load_problems, select

    chosen = select(load_problems(), problems)
    rows = evaluate(address, chosen, n=n, budgets_ms=[int(b) for b in budgets.split(",")],
                    modes=[m for m in modes.split(",") if m], temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, limits=SandboxLimits(timeout_s=timeout_s),
                    sandbox_workers=sandbox_workers, progress=lambda m: click.echo(m, err=True))
    table = markdown_table(rows)
    click.echo(table)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"benchmark": "humaneval-time-budget",
                                                      "environment": describe("client"), "address": address,
                                                      "problems": problems, "temperature": temperature,
                                                      "top_p": top_p, "results": rows}, indent=2) + "\n")
        (out / "results.md").write_text(table)
        plot(rows, out / "pass_rates.png")


COMMANDS = [eval_group]
