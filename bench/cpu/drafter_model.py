"""What each way of drafting would cost a token, replayed over the target's own greedy text.

Speculation's drafts can come from the draft model (k forwards a step) or from the sequence's
own text (prompt lookup: what followed the last recurrence of its latest tokens; no forward at
all). Which pays depends on how often each is right and on what a step costs, so this replays
the target's greedy text of HumanEval prompts (bench/cpu/draft_agreement.py --ranks-out: the
tokens, and for each the draft's rank of it) through each policy, step by step, and prices the
steps with measured step costs (defaults: the H200 profile of 2026-11-27, in-process; see
COSTS). Batches run their sequences in lockstep, as the coordinator does; a finished sequence
leaves the batch.

Policies:
- `regular`: one token a step.
- `draftK`: the draft proposes K tokens; accepted up to its first miss.
- `lookupL`: up to L lookup tokens, no draft forward; a sequence without a match verifies none.
- `hybridL.K[.nN]`: a lookup step where every sequence's latest N (default 1) or more tokens
  recur, else a draft step of K for all.
- `tailK.M`: a draft step of K, its drafts followed by up to M lookup tokens continued from
  them (verified in the same pass).
- `selfK.L[.F]`: the draft checks lookup tokens itself. Each draft forward feeds the chain's last
  token and up to L lookup tokens continued from the chain, and keeps those the draft would
  have drafted (its own choice at each position, exactly as drafting them one by one): a
  forward yields 1 + the run of lookup tokens it confirmed. The proposals are the draft's own
  chain, so the target accepts what `draftK` would; only the number of draft forwards changes.
  Without F every sequence drafts K (the step takes the most forwards any sequence needs);
  with F the step runs F forwards and each sequence proposes what it has by then (up to K).
  A lookup token counts as confirmed only where the draft agrees with the target (rank 0), so
  past a sequence's first miss each forward yields one token (the draft's own text there is
  not in the file): a lower bound on the forwards saved.

    .venv/bin/python bench/cpu/drafter_model.py RANKS.json [--batches 1,8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

from bass.coordinator.lookup_drafts import NgramIndex
from bass.core.config import LOOKUP_WINDOW

# ms. A draft forward: the H200 profile of 2026-11-27 (bench/results/2026-11-27-h200-profile-steps/,
# in-process, d928575), 0.71 at 1 sequence; ~4% more at 8 (bass bench steps). A regular step and
# what each row past one a sequence adds to a verification: `bass bench steps` on an H200
# (bench/results/2026-11-27-h200x2-one-gpu-stream-and-lookup/bench-steps-verify-rows-445470b.json,
# random weights, CUDA graphs): regular 1.80 / 1.87 at 1 / 8 sequences; verifying 1 and 8 drafts
# 1.83 and 1.85 at 1 sequence, 1.95 and 2.15 at 8.
# A draft forward of more than 16 rows against one of 1-16 (the fused few-row path's limit): an
# assumption, not a measurement (a target verification of 32 rows cost 1.13x one of 8 in kernel
# time on an H100, 2026-11-28; the draft's small products gain more from the fused path).
WIDE_DRAFT_FACTOR = 1.3

COSTS = {
    "draft_forward": {1: 0.71, 8: 0.74},
    "regular": {1: 1.80, 8: 1.87},
    "per_extra_row": {1: (1.8457 - 1.8286) / 7, 8: (2.1455 - 1.9466) / (7 * 8)},
}


def cost_at(table: dict[int, float], batch: int) -> float:
    """Linear between the measured batch sizes, flat beyond."""
    points = sorted(table)
    if batch <= points[0]:
        return table[points[0]]
    for lo, hi in zip(points, points[1:]):
        if batch <= hi:
            return table[lo] + (table[hi] - table[lo]) * (batch - lo) / (hi - lo)
    return table[points[-1]]


class Sequence:
    def __init__(self, prompt: list[int], generated: list[int], ranks: list[int]):
        self.generated, self.ranks, self.done = generated, ranks, 0
        self.index = NgramIndex(3)
        self.index.extend(prompt[-LOOKUP_WINDOW:])

    @property
    def finished(self) -> bool:
        return self.done >= len(self.generated)

    def draft_run(self, k: int) -> int:
        """Draft tokens the target takes of k proposed from here (up to the draft's first miss)."""
        run = 0
        while run < k and self.done + run < len(self.generated) and self.ranks[self.done + run] == 0:
            run += 1
        return run

    def lookup(self, count: int, after: int = 0) -> tuple[int, int]:
        """(matched n-gram length, tokens the target takes) of `count` lookup tokens proposed
        after the next `after` tokens of the target's text (which the step's drafts carry)."""
        at = self.done + after
        suffix = self.index.tokens + self.generated[self.done:at]
        n, proposed = self.index.match(suffix, count)
        taken = 0
        for j, token in enumerate(proposed):
            if at + j >= len(self.generated) or self.generated[at + j] != token:
                break
            taken += 1
        return n, taken

    def confirmed(self, at: int, count: int) -> int:
        """Of `count` lookup tokens continued from the target's text up to `at` tokens past the
        commit, how many a draft forward confirms: the run that equals the target's text where
        the draft drafts it too (rank 0)."""
        _, taken = self.lookup(count, after=at)
        run = 0
        while run < taken and self.ranks[self.done + at + run] == 0:
            run += 1
        return run

    def self_drafted(self, k: int, lookups: int, forwards: int | None = None) -> tuple[int, int]:
        """(draft forwards, draft tokens) of a `self` step: until k tokens are drafted, or the
        tokens drafted in `forwards` forwards (at most k)."""
        drafted = spent = 0
        on_text = True  # every token drafted so far is the target's (rank 0)
        while drafted < k and (forwards is None or spent < forwards):
            spent += 1
            at = self.done + drafted
            extra = self.confirmed(drafted, lookups) if on_text and at < len(self.generated) else 0
            # the forward's last token, after the confirmed ones, is the draft's own choice
            on_text = on_text and at + extra < len(self.generated) and self.ranks[at + extra] == 0
            drafted = min(k, drafted + 1 + extra)
        return spent, drafted

    def advance(self, tokens: int) -> None:
        tokens = min(tokens, len(self.generated) - self.done)
        self.index.extend(self.generated[self.done:self.done + tokens])
        self.done += tokens


def parse(policy: str) -> tuple[str, list[int]]:
    for name in ("regular", "draft", "lookup", "hybrid", "tail", "self"):
        if policy.startswith(name):
            rest = policy[len(name):]
            args = [int(x.lstrip("n")) for x in rest.split(".") if x]
            return name, args
    raise ValueError(f"unknown policy {policy!r}")


def step(kind: str, args: list[int], live: list[Sequence]) -> tuple[float, list[int]]:
    """One step of a policy over the live sequences: its cost (ms) and each one's tokens."""
    b = len(live)
    forward, regular, per_row = (cost_at(COSTS[c], b) for c in ("draft_forward", "regular", "per_extra_row"))
    if kind == "regular":
        return regular, [1] * b
    if kind == "draft":
        k = args[0]
        return k * forward + regular + per_row * k * b, [s.draft_run(k) + 1 for s in live]
    if kind == "lookup":
        found = [s.lookup(args[0]) for s in live]
        rows = sum(args[0] if n else 0 for n, _ in found)
        return regular + per_row * rows, [taken + 1 for _, taken in found]
    if kind == "hybrid":
        count, k = args[0], args[1]
        least = args[2] if len(args) > 2 else 1
        found = [s.lookup(count) for s in live]
        matched = [n >= least for n, _ in found]
        if all(matched):
            return regular + per_row * count * b, [taken + 1 for _, taken in found]
        # Some sequence has no match: the draft runs for the batch, and every sequence verifies
        # its drafts (one linear proposal a sequence).
        return k * forward + regular + per_row * k * b, [s.draft_run(k) + 1 for s in live]
    if kind == "tail":
        k, m = args
        tokens = []
        for s in live:
            run = s.draft_run(k)
            extra = s.lookup(m, after=k)[1] if run == k else 0
            tokens.append(run + extra + 1)
        return k * forward + regular + per_row * (k + m) * b, tokens
    if kind == "self":
        k, lookups = args[0], args[1]
        fixed = args[2] if len(args) > 2 else None
        drafted = [s.self_drafted(k, lookups, fixed) for s in live]
        forwards = fixed if fixed is not None else max(f for f, _ in drafted)
        # A forward of 1 + L rows a sequence: the same as one row up to the fused path's 16
        # rows, WIDE_DRAFT_FACTOR beyond (cuBLAS).
        wide = WIDE_DRAFT_FACTOR if b * (1 + lookups) > 16 else 1.0
        rows = sum(n for _, n in drafted)
        return (forwards * forward * wide + regular + per_row * rows,
                [s.draft_run(n) + 1 for s, (_, n) in zip(live, drafted)])
    raise ValueError(kind)


def replay(policy: str, texts: list[dict], ranks: list[list[int]], batch: int) -> dict:
    kind, args = parse(policy)
    spent, tokens, steps = 0.0, 0, 0
    groups = [list(range(i, min(i + batch, len(texts)))) for i in range(0, len(texts), batch)]
    for group in groups:
        seqs = [Sequence(texts[i]["prompt"], texts[i]["generated"], ranks[i]) for i in group]
        while True:
            live = [s for s in seqs if not s.finished]
            if not live:
                break
            cost, taken = step(kind, args, live)
            spent += cost
            steps += 1
            for s, t in zip(live, taken):
                tokens += min(t, len(s.generated) - s.done)
                s.advance(t)
    # ms a token a sequence: the batch's time over the tokens each of its sequences made
    return {"policy": policy, "batch": batch, "steps": steps,
            "ms_per_token_per_sequence": round(spent * batch / tokens, 4) if tokens else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ranks", help="bench/cpu/draft_agreement.py --ranks-out's file")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--policies", default="regular,draft2,draft3,draft4,lookup4,lookup8,lookup16,"
                                              "hybrid8.3,hybrid8.3.n2,hybrid8.3.n3,hybrid16.3.n2,tail3.4,tail3.8")
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.ranks) as f:
        data = json.load(f)
    texts, ranks = data["texts"], data["ranks"]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        base = None
        for policy in args.policies.split(","):
            row = replay(policy, texts, ranks, batch)
            base = row["ms_per_token_per_sequence"] if policy == "regular" else base
            if base:
                row["speedup_over_regular"] = round(base / row["ms_per_token_per_sequence"], 3)
            rows.append(row)
            print(json.dumps(row))
    summary = {"benchmark": "drafter_model", "problems": data["problems"], "costs_ms": COSTS,
               "tokens": sum(len(t["generated"]) for t in texts),
               "mean_generated": statistics.fmean(len(t["generated"]) for t in texts), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
