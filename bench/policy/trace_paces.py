"""Each sequence's pace in a traced `bass bench speed` run, against what `auto` believed.

For every row of a `bass bench speed --trace` JSON: each sequence's tokens per drafted step over
the reported round, the slowest sequence's share of the mean's gain beyond one token (what
`auto`'s batch tail is, MeasuredCost.gain_share), and, for `auto`, the share it remembered per
batch-size bucket (policy_state's slowest_gain_share). On the H200 (2026-11-25 night 3) auto
remembered 0.78-0.81 at greedy 8 where fixed k = 2 / 3 realized 0.87-0.90 by a cruder count
(and 0.79-0.84 against 0.87-0.89 at T = 0.8 and 4); this reads it from the sequences themselves.

    python bench/policy/trace_paces.py bench/results/.../speed.json [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import statistics


def paces(trace: list) -> dict[int, float]:
    """seq_id -> tokens per drafted step over the trace's drafted steps."""
    tokens: dict[int, int] = {}
    steps: dict[int, int] = {}
    for k, _, _, _, _, per_sequence, _ in trace:
        if k:
            for seq_id, n in per_sequence:
                tokens[seq_id] = tokens.get(seq_id, 0) + n
                steps[seq_id] = steps.get(seq_id, 0) + 1
    return {seq_id: tokens[seq_id] / steps[seq_id] for seq_id in tokens}


def slowest_share(by_sequence: dict[int, float]) -> float | None:
    """The slowest sequence's gain beyond one token a step over the mean's (None: no gain)."""
    if len(by_sequence) < 2:
        return None
    mean = statistics.fmean(by_sequence.values())
    return None if mean <= 1 else (min(by_sequence.values()) - 1) / (mean - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--batch", type=int, default=None, help="only rows of this batch size")
    args = parser.parse_args()
    for row in json.load(open(args.json))["results"]:
        if args.batch is not None and row["batch"] != args.batch:
            continue
        trace = row["step_stats"].get("trace")
        if not trace:
            print(f"batch {row['batch']} policy {row['policy']}: no trace (run with --trace)")
            continue
        by_sequence = paces(trace)
        share = slowest_share(by_sequence)
        line = (f"batch {row['batch']} policy {row['policy']}: {row['ms_per_token_per_sequence']:.3f} ms/token/seq, "
                f"{len(by_sequence)} sequences drafted, tokens per drafted step "
                f"{' '.join(f'{p:.2f}' for p in sorted(by_sequence.values()))}; slowest share "
                f"{'-' if share is None else f'{share:.2f}'}")
        remembered = (row.get("policy_state") or {}).get("slowest_gain_share")
        if remembered:
            line += f"; auto remembered {remembered}"
        print(line)


if __name__ == "__main__":
    main()
