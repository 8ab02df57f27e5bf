"""`bass bench serve` results as a markdown table and a PNG (latency and throughput against the
offered load, speculative next to regular).

`python -m bass.app.bench.serve_report RESULTS.json [OUT.png]` redraws both from a results file (for
machines where the run happened without matplotlib).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _p(dist: dict | None, q: str) -> str:
    return "-" if not dist else f"{dist[q]:.1f}"


def _num(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def markdown_table(result: dict) -> str:
    lines = ["| mode | load | done | errors | req/s | out tok/s | goodput/s | TTFT p50 / p99 ms | "
             "TPOT p50 / p90 / p99 ms | ITL p50 / p99 ms | ITL p99 with / without prefill ms | E2E p50 / p99 ms | "
             "tok/delta | mismatches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
        check = r.get("correctness")
        mismatches = "not checked" if check is None else str(check["mismatches"])
        lines.append(
            f"| {r['mode']} | {r['load']['label']} | {r['completed']}/{r['requests']} | {errors} | "
            f"{_num(r['requests_per_s'])} | {_num(r['output_tokens_per_s'], '{:.0f}')} | "
            f"{_num(r['goodput_per_s'])} | {_p(r['ttft_ms'], 'p50')} / {_p(r['ttft_ms'], 'p99')} | "
            f"{_p(r['tpot_ms'], 'p50')} / {_p(r['tpot_ms'], 'p90')} / {_p(r['tpot_ms'], 'p99')} | "
            f"{_p(r['itl_ms'], 'p50')} / {_p(r['itl_ms'], 'p99')} | "
            f"{_p(r['itl_ms_with_prefill'], 'p99')} / {_p(r['itl_ms_without_prefill'], 'p99')} | {_p(r['e2e_ms'], 'p50')} / {_p(r['e2e_ms'], 'p99')} | "
            f"{_num(r['tokens_per_delta'])} | {mismatches} |")
    refs = result.get("references")
    if refs and refs["requests"]:
        failed = ", ".join(f"{k} {v}" for k, v in refs["failed"].items()) or "none failed"
        lines += ["", f"References: {refs['requests']} distinct requests sent alone first ({failed}); "
                      "mismatches = completed requests whose answer or stream was wrong."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A categorical x axis: offered rates are roughly geometric and "inf" has no position.
    labels = list(dict.fromkeys(r["load"]["label"] for r in result["runs"]))
    kind = result["runs"][0]["load"]["kind"] if result["runs"] else "rate"
    panels = [("tpot_ms", "TPOT (ms)"), ("itl_ms", "inter-token latency (ms)"), ("ttft_ms", "TTFT (ms)"),
              (None, "output tokens/s")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        for mode, color in (("speculative", "tab:blue"), ("regular", "tab:orange")):
            runs = {r["load"]["label"]: r for r in result["runs"] if r["mode"] == mode}
            xs = [i for i, label in enumerate(labels) if label in runs]
            if not xs:
                continue
            if key is None:
                ax.plot(xs, [runs[labels[i]]["output_tokens_per_s"] or 0 for i in xs], "-o", color=color, label=mode)
                continue
            for q, style in (("p50", "-o"), ("p99", "--^")):
                ys = [runs[labels[i]][key][q] if runs[labels[i]][key] else float("nan") for i in xs]
                ax.plot(xs, ys, style, color=color, label=f"{mode} {q}")
        ax.set_title(title)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("offered rate (requests/s)" if kind == "rate" else "concurrent clients")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    env = result.get("environment", {})
    fig.suptitle(f"bass bench serve: {env.get('gpu') or env.get('gpu_on_client_machine') or env.get('cpu') or ''} {env.get('commit', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    src = Path(argv[0])
    result = json.loads(src.read_text())
    src.with_suffix(".md").write_text(markdown_table(result))
    plot(result, Path(argv[1]) if len(argv) > 1 else src.with_suffix(".png"))


if __name__ == "__main__":
    main(sys.argv[1:])
