"""What lookup stand-ins (coordinator/lookup_drafts.py) could give and what they cost, on the CPU.

1. Text alone: over HumanEval's canonical solutions (the bundled tokenizer), at every position,
   how many of a K-token lookup the solution's own next tokens take, with the index started
   from the prompt's last W tokens (bass/core/config.py's LOOKUP_WINDOW), for K = 4, 6
   and a few W.
2. The coordinator's thread: building an index per token, and a streamed step's lookups and
   commits through DraftsAhead with every sequence looking up every step (the worst case), at
   1 and 16 sequences of 1,000-token contexts.

    .venv/bin/python bench/cpu/lookup_stand_ins.py [--out FILE]   (after `make models`: the tokenizer)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from tokenizers import Tokenizer

from bass.app.humaneval_problems import load_problems
from bass.coordinator.draft_ahead import DraftsAhead
from bass.coordinator.lookup_drafts import NgramIndex

TOKENIZER = os.path.expanduser("~/.cache/bass/models/qwen2.5-coder-1.5b-instruct/tokenizer.json")


def taken(index: NgramIndex, text: list[int], at: int, count: int) -> int:
    n = 0
    for j, proposed in enumerate(index.continuation(index.tokens, count)):
        if at + j >= len(text) or text[at + j] != proposed:
            break
        n += 1
    return n


def text_alone() -> list[dict]:
    tok = Tokenizer.from_file(TOKENIZER)
    pairs = []
    for p in load_problems():
        prompt = tok.encode(p["prompt"]).ids
        pairs.append((prompt, tok.encode(p["prompt"] + p["canonical_solution"]).ids[len(prompt):]))
    rows = []
    for count in (4, 6):
        for window in (64, 256, None):
            accepted = []
            for prompt, solution in pairs:
                index = NgramIndex(3)
                index.extend(prompt if window is None else prompt[-window:])
                for i, token in enumerate(solution):
                    accepted.append(taken(index, solution, i, count))
                    index.extend([token])
            rows.append({"lookup_tokens": count, "prompt_window": window or "all",
                         "mean_taken": round(statistics.fmean(accepted), 3), "positions": len(accepted)})
            print(rows[-1], flush=True)
    return rows


def host_cost() -> dict:
    draw = random.Random(0)
    tokens = [draw.randint(0, 150_000) for _ in range(2000)]
    started = time.perf_counter()
    NgramIndex(3).extend(tokens)
    out = {"index_build_us_per_token": round(1e6 * (time.perf_counter() - started) / len(tokens), 2)}
    for lookup in (0, 3):
        for batch in (1, 16):
            ahead = DraftsAhead(lookup)
            for s in range(batch):
                ahead.follow(s, [draw.randint(0, 2000) for _ in range(1000)])
            commits = [[draw.randint(0, 2000) for _ in range(2)] for _ in range(300 * batch)]
            times = []
            for step in range(300):
                t0 = time.perf_counter()
                for s in range(batch):
                    block = ahead.block(s, 4)
                    ahead.lookup(s, block, 4 - len(block))
                for s in range(batch):
                    ahead.commit(s, commits[step * batch + s])
                times.append(time.perf_counter() - t0)
            out[f"step_us_lookup{lookup}_batch{batch}"] = round(1e6 * statistics.median(times[10:]), 1)
            out[f"first_step_us_lookup{lookup}_batch{batch}"] = round(1e6 * times[0], 1)
    print(out, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    result = {"benchmark": "lookup_stand_ins", "cpu_threads": os.cpu_count(), "text_alone": text_alone(),
              "host_cost": host_cost()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
