"""Where `auto`'s price of a regular step comes from, in a traced `bass bench speed` run.

`auto` prices regular decoding at each batch-size bucket by the regular steps it times (only
steady ones: sent behind another, committed behind the next), and those come from runs of
regular steps of very different lengths: a bucket's first measurement (a few steps), a k = 0
probe while speculating (regular_steps_in_flight + 2 steps), or long stretches where it chose
regular decoding. On an H100 (2026-11-28, greedy, 64 sequences) one process priced a regular
step at 3.98 ms where its regular rows ran 2.88 ms steps, and drafted k = 4 where regular
decoding was as fast. This splits every row's regular steps by the length of the run they sit
in and by their place in it: each step's period (commit to commit, what the policy is given)
and the worker call's time where the step was steady (the trace's timed column), medians in ms;
for `auto` rows beside the price its policy_state holds for the bucket.

    python bench/policy/trace_regular_runs.py SPEED.json [--batch 64]
    (SPEED.json from `bass bench speed ... --trace`, e.g. BATCHES=64 POLICIES=0,auto
    bench/gpu/runs/readme_table.sh greedy --trace)
"""

from __future__ import annotations

import argparse
import json
import statistics

from bass.coordinator.draft_length import MeasuredCost

SHORT_RUN = 6  # a bucket's first measurement or a k = 0 probe is at most this many steps


def regular_runs(trace: list) -> list[list[tuple[float | None, float | None]]]:
    """Runs of consecutive regular steps: per step (period ms, timed ms or None). A step's
    period is from the previous step's commit (None for the trace's first)."""
    runs: list[list[tuple[float | None, float | None]]] = []
    previous_at = None
    in_run = False
    for k, _, _, _, timed, _, at in trace:
        period = None if previous_at is None else at - previous_at
        previous_at = at
        if k:
            in_run = False
            continue
        if not in_run:
            runs.append([])
            in_run = True
        runs[-1].append((period, timed))
    return runs


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summary(trace: list) -> dict:
    """Medians of the regular steps' periods and steady timings, by run length and by place."""
    runs = regular_runs(trace)
    out: dict = {"runs": len(runs), "run_lengths": [len(run) for run in runs]}
    for name, chosen in (("short runs", [r for r in runs if len(r) <= SHORT_RUN]),
                         ("long runs", [r for r in runs if len(r) > SHORT_RUN])):
        steps = [step for run in chosen for step in run[1:]]  # a run's first period spans a mode change
        out[name] = {"steps": len(steps), "period_ms": _median([p for p, _ in steps if p is not None]),
                     "timed_ms": _median([t for _, t in steps if t is not None])}
    places = {}
    for place in range(1, SHORT_RUN + 1):
        steps = [run[place] for run in runs if len(run) > place]
        places[place + 1] = {"period_ms": _median([p for p, _ in steps if p is not None]),
                             "timed_ms": _median([t for _, t in steps if t is not None])}
    out["by_place_in_run"] = places
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("speed_json")
    parser.add_argument("--batch", type=int)
    args = parser.parse_args()
    with open(args.speed_json) as f:
        results = json.load(f)["results"]
    for row in results:
        trace = row["step_stats"].get("trace")
        if not trace or (args.batch and row["batch"] != args.batch):
            continue
        report = {"batch": row["batch"], "policy": row["policy"], "mode": row["mode"],
                  "ms_per_token_per_sequence": row["ms_per_token_per_sequence"], **summary(trace)}
        state = row.get("policy_state")
        if state:
            bucket = MeasuredCost.bucket(row["batch"])
            report["auto_price_ms"] = state["buckets"].get(str(bucket), {}).get("verify", {}).get("0")
        print(json.dumps(report))


if __name__ == "__main__":
    main()
