#!/usr/bin/env python3
"""The coordinator's text work per sequence-step: stop strings and streaming, CPU time.

The coordinator runs on a CPU (it has no GPU in any deployment), once per step for every
running sequence, so its cost adds to every step's latency. This times one sequence-step's
text work as the coordinator does it (`check_stop` over a window, then the stable text that a
stream sends; coordinator/incremental_text.py) against the plain way of decoding the whole
output every step (the stop search decodes the output before and after the new tokens, the
stream decodes it once more), at several output lengths. Tokens are HumanEval's canonical
solutions through the real tokenizer, 5 per step (k = 4 accepted + 1), and four stop strings
that never match, so that every step searches.

Usage (after `make models`):
  .venv/bin/python bench/cpu/coordinator_text.py --out bench/results/DATE-cpu-coordinator-text.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bass.app.bench.environment import describe
from bass.app.humaneval_problems import load_problems
from bass.coordinator.incremental_text import IncrementalText
from bass.coordinator.stopping import StopCriteria, check_stop
from bass.coordinator.tokenizer import HFCodec

# Absent from the text, so that every step searches them all and no sequence stops early.
STOPS = ("\nclass NeverDefined", "\nif __name__ == '__never__'", "\n### end", "\nprint(NEVER)")
TOKENS_PER_STEP = 5


def windowed(codec: HFCodec, ids: list[int]) -> list[float]:
    text, criteria, costs = IncrementalText(codec.decode), StopCriteria(frozenset(), STOPS, 1 << 30), []
    for start in range(0, len(ids), TOKENS_PER_STEP):
        new = ids[start:start + TOKENS_PER_STEP]
        began = time.perf_counter()
        decision = check_stop(start, text, new, criteria)
        assert decision.reason is None
        text.extend(decision.text_tokens(new))
        _ = text.stable  # what a stream sends
        costs.append(time.perf_counter() - began)
    assert text.text() == codec.decode(ids)
    return costs


def whole_output(codec: HFCodec, ids: list[int]) -> list[float]:
    output, costs, longest = [], [], max(len(s) for s in STOPS)
    for start in range(0, len(ids), TOKENS_PER_STEP):
        new = ids[start:start + TOKENS_PER_STEP]
        began = time.perf_counter()
        old_len = len(codec.decode(output))
        after = codec.decode(output + new)
        assert not any(after.find(s, max(0, old_len - longest)) >= 0 for s in STOPS)
        output.extend(new)
        _ = codec.decode(output)  # what a stream sends
        costs.append(time.perf_counter() - began)
    return costs


def main() -> None:
    from bass.app.models.fetch import default_model_dirs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=default_model_dirs()[1],
                        help="model directory with the tokenizer [the bundled target]")
    parser.add_argument("--lengths", default="128,512,2048", help="output lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    codec = HFCodec(args.tokenizer)
    corpus = codec.encode("".join(p["prompt"] + p["canonical_solution"] for p in load_problems()))
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        ids = corpus[:length]
        row = {"output_tokens": length, "tokens_per_step": TOKENS_PER_STEP}
        for name, run in (("windowed", windowed), ("whole_output", whole_output)):
            runs = [run(codec, ids) for _ in range(args.repeats)]
            mean = statistics.median(sum(c) / len(c) for c in runs)
            last = statistics.median(sum(c[-10:]) / 10 for c in runs)
            row[name] = {"us_per_sequence_step_mean": round(mean * 1e6, 1),
                         "us_per_sequence_step_at_end": round(last * 1e6, 1)}
        rows.append(row)
        print(f"{length:5d} tokens: windowed {row['windowed']['us_per_sequence_step_at_end']:8.1f} us at the end, "
              f"whole output {row['whole_output']['us_per_sequence_step_at_end']:8.1f} us (per sequence-step)")
    result = {"benchmark": "coordinator-text", "environment": describe("cpu"), "tokenizer": args.tokenizer.name,
              "stop_strings": list(STOPS), "repeats": args.repeats, "results": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
