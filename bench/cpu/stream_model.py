"""A model of streamed speculation at one sequence, to weigh its next levers before building them.

Replays, per HumanEval prompt, where the real draft agrees with the target's greedy text (the
per-token ranks `bench/cpu/draft_agreement.py --ranks-out` writes: 0 = the draft's first choice is
the target's token, 1 = its second, ...) through the timeline of coordinator/streamed_step.py and
draft_service/stream.py with the step costs measured on two H200s (bench/results/journal/
2026-11-27-h200x2-streamed.md, run 3, one sequence):

- a step takes `step_ms` (verification + the Verify round trip + the coordinator) and verifies up
  to `block` of the drafts that have arrived, back to back (no wait);
- the draft drafts a token every `draft_ms` while it is fewer than `lookahead` tokens ahead of the
  commits it has heard of; its tokens reach the coordinator, and the commits reach it, `link_ms`
  later;
- along the target's text the draft's token at a position is right where its rank is 0; its first
  wrong token ends what a step can accept, and the draft, once it hears of that commit, finishes
  the forward it is in and drafts again from the committed text;
- `hedge`: the draft also drafts from its second choice at each unverified position, so a wrong
  token whose rank is 1 costs the step its remaining drafts but not the draft's chain;
  `hedge_rows`: only at positions it drafted fewer than this many tokens past the commits it had
  heard of (a branch row per such position; None: at every position);
- `queued`: a contradiction also waits for the call the loop keeps queued behind the one in flight;
- `wait_ms`: a step whose sequence holds no draft waits up to this long for one;
- `lag_ms`: a step verifies the drafts that had arrived this long before it starts (its Verify
  sent while the step before ran, the target picking the block: the round trip hidden);
- `self_lookup`: each draft forward also feeds up to this many lookup tokens continued from its
  chain (the sequence's own text, bench/cpu/drafter_model.py's `self` policy) and keeps those it
  would have drafted itself: where the chain follows the target's text a forward yields 1 + the
  run of them that equals the text at rank 0 (needs the ranks file's texts; 0: off).

First the model is checked against what run 3 measured (ms a token, sequence-steps without a
draft); then it predicts the levers. An estimate, not a measurement: compare the levers with each
other, and build before believing a number.

    .venv/bin/python bench/cpu/stream_model.py RANKS.json [--agreement A [--second S]] [--out FILE]
    .venv/bin/python bench/cpu/stream_model.py --agreement 0.88 --cases restart   # no ranks file: 64 x 128 draws
"""

from __future__ import annotations

import argparse
import json
import random
from collections import deque
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Costs:
    step_ms: float = 3.15
    draft_ms: float = 0.72
    link_ms: float = 0.25
    block: int = 6
    lookahead: int = 8
    hedge: bool = False
    hedge_rows: int | None = None
    queued: bool = False
    wait_ms: float = 0.0
    lag_ms: float = 0.0
    self_lookup: int = 0


def confirmed_runs(text: dict, ranks: list[int], lookups: int) -> list[int]:
    """Per position p of the generated text: how many of `lookups` lookup tokens continued from
    the text before p a draft forward at p confirms (they equal the text, where the draft's first
    choice is the text's token): drafter_model's `self` policy, position by position."""
    from drafter_model import Sequence  # bench/cpu, this script's folder

    seq, runs = Sequence(text["prompt"], text["generated"], ranks), []
    while not seq.finished:
        runs.append(seq.confirmed(0, lookups))
        seq.advance(1)
    return runs


def simulate(ranks: list[int], c: Costs, confirmed: list[int] | None = None) -> dict:
    """One sequence decoding len(ranks) tokens (confirmed: confirmed_runs, for self_lookup)."""
    n, inf = len(ranks), float("inf")
    # Per drafted position, whether a branch was drafted from its second choice (hedge_rows);
    # a position never drafted counts as covered: the draft hears its commit before it gets there.
    branched: dict[int, bool] = {}

    def breaks(anchor: int) -> int:
        """Where a chain drafted from `anchor` leaves the target's text: its first wrong token
        that no hedge covers (every token after it is drafted from a wrong prefix)."""
        p = anchor
        while p < n and (ranks[p] == 0 or (c.hedge and ranks[p] == 1 and branched.get(p, True))):
            p += 1
        return p

    committed, heard = 0, 0
    heard_at: deque[tuple[float, int]] = deque()  # (when the draft hears it, the committed count)
    anchor, arrivals = 0, []  # the draft's chain: its token at anchor + i reaches the coordinator at arrivals[i]
    free_at = 0.0  # when the draft's last forward ended
    now, steps, starved = 0.0, 0, 0

    def draft_until(t: float) -> None:
        nonlocal anchor, arrivals, free_at, heard
        while True:
            position = anchor + len(arrivals)
            drafting = position < n and position - heard < c.lookahead
            next_token = free_at + c.draft_ms if drafting else inf
            next_commit = heard_at[0][0] if heard_at else inf
            if min(next_token, next_commit) > t:
                return
            if next_commit <= next_token:
                when, heard = heard_at.popleft()
                if breaks(anchor) < heard:  # the commit contradicts the chain: start over there
                    anchor, arrivals = heard, []
                    # after the forward in flight (and the one queued behind it)
                    free_at = next_token + (c.draft_ms if c.queued else 0.0) if drafting else when
                elif not drafting:
                    free_at = max(free_at, when)  # it waited at the lookahead
                continue
            free_at = next_token
            # One token a forward; with self_lookup, those it confirmed too (where its chain up
            # to here follows the text), within the lookahead.
            extra = confirmed[position] if c.self_lookup and confirmed and breaks(anchor) >= position else 0
            for p in range(position, min(position + 1 + extra, n, heard + c.lookahead)):
                branched[p] = c.hedge_rows is None or p - heard < c.hedge_rows
                arrivals.append(next_token + c.link_ms)

    def holds_draft(t: float) -> bool:
        return breaks(anchor) >= committed and any(at <= t and anchor + i >= committed
                                                   for i, at in enumerate(arrivals))

    while committed < n:
        draft_until(now)
        if c.wait_ms and not holds_draft(now):
            until = now + c.wait_ms
            while now < until and not holds_draft(now):
                now = min(until, now + 0.05)
                draft_until(now)
        block = []
        if breaks(anchor) >= committed:  # the chain continues the committed text
            for i, at in enumerate(arrivals):
                p = anchor + i
                if at > now - c.lag_ms or len(block) == c.block:
                    break
                if p >= committed:
                    block.append(p)
        steps += 1
        starved += not block
        accepted = 0
        for p in block:
            if ranks[p] != 0:
                break
            accepted += 1
        committed = min(n, committed + accepted + 1)
        now += c.step_ms
        heard_at.append((now + c.link_ms, committed))
    return {"ms": now, "steps": steps, "starved": starved, "tokens": n}


def run(all_ranks: list[list[int]], c: Costs, texts: list[dict] | None = None) -> dict:
    if c.self_lookup and texts is None:
        raise ValueError("self_lookup needs the ranks file's texts")
    confirmed = [confirmed_runs(t, r, c.self_lookup) if c.self_lookup else None
                 for t, r in zip(texts or [None] * len(all_ranks), all_ranks)]
    results = [simulate(r, c, k) for r, k in zip(all_ranks, confirmed) if r]
    tokens = sum(r["tokens"] for r in results)
    steps = sum(r["steps"] for r in results)
    return {"ms_per_token": round(sum(r["ms"] for r in results) / tokens, 3),
            "tokens_per_step": round(tokens / steps, 2), "starved": round(sum(r["starved"] for r in results) / steps, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ranks", nargs="?", help="draft_agreement.py --ranks-out's file (else --agreement draws)")
    parser.add_argument("--agreement", type=float,
                        help="instead of the file's ranks, draws of the same lengths where the draft's first "
                             "choice is right with this probability (the GPU's bf16 pair agrees less than fp32)")
    parser.add_argument("--second", type=float, default=0.6,
                        help="with --agreement: where the first choice is wrong, how often the second is right")
    parser.add_argument("--cases", choices=["levers", "restart", "one-gpu", "h100-ca7633b", "hedge-rows", "self-lookup"],
                        default="levers",
                        help="levers: the streamed session's (hedging, a faster draft, the round trip); restart: "
                             "the seventh session's (a queued call, waiting, a pipelined Verify), at stream4's "
                             "3.26 ms step; one-gpu: both models streaming on one GPU in one process (the "
                             "in-process profile's 1.80 ms verification and 0.71 ms draft token, both slowed "
                             "by a factor s while they share the GPU); h100-ca7633b: the levers at the H100's "
                             "forwards of ca7633b (a target forward of 7 rows ~1.75 ms of GPU time, fused; a "
                             "draft token 0.60 ms), the Verify round trip and coordinator as run 3 measured; "
                             "hedge-rows: hedging at those costs with a branch row only at the first 1, 2, 3, 4 or "
                             "8 positions past the commits the draft has heard of; self-lookup: at those costs, "
                             "draft forwards that confirm 2, 4 or 8 lookup tokens (needs a ranks file)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.ranks is None and args.agreement is None:
        parser.error("give a ranks file, or --agreement")
    data = json.load(open(args.ranks)) if args.ranks else {"ranks": [[0] * 128 for _ in range(64)]}
    ranks, texts = data["ranks"], data.get("texts")
    if args.agreement is not None:
        draw = random.Random(0)
        ranks = [[0 if draw.random() < args.agreement else 1 if draw.random() < args.second else 2 for _ in r]
                 for r in ranks]
    base = Costs()
    if args.cases == "one-gpu":
        cases = {f"one GPU, the models slowed {s}x by sharing it": Costs(step_ms=1.8 * s + 0.15, draft_ms=0.71 * s,
                                                                          link_ms=0.05, block=4)
                 for s in (1.0, 1.2, 1.4, 1.6)}
    elif args.cases == "h100-ca7633b":
        # Not measured on two GPUs at this build: run 3's ~1 ms of round trip and coordinator added
        # to the forwards' GPU time (bench/results/journal/2026-11-27-h100-wide-fused.md); one GPU
        # through the services ran k = 3 at 1.12-1.22 and auto at 1.02-1.06 ms a token there.
        now = Costs(step_ms=1.75 + 1.05, draft_ms=0.60)
        cases = {
            "streamed K = 6 at these forwards": now,
            "hedged on the second choice": replace(now, hedge=True),
            "Verify round trip halved": replace(now, step_ms=now.step_ms - 0.5),
            "hedged + round trip halved": replace(now, hedge=True, step_ms=now.step_ms - 0.5),
            "hedged + round trip gone (target and coordinator in one process, no GIL cost)":
                replace(now, hedge=True, step_ms=1.75 + 0.1, link_ms=0.15),
        }
    elif args.cases == "hedge-rows":
        # How many branch rows a sequence needs for hedging to pay: a branch at each unverified
        # position (the 2026-11-27 sketch) costs up to `lookahead` rows a sequence and a new row
        # every drafted token, which the draft loop's on-device extension cannot follow.
        now = Costs(step_ms=1.75 + 1.05, draft_ms=0.60)
        cases = {"streamed K = 6, no hedge": now}
        cases.update({f"hedged at the first {rows} position(s) past the commits heard": replace(now, hedge=True,
                                                                                               hedge_rows=rows)
                      for rows in (1, 2, 3, 4, 6)})
        cases["hedged at every position"] = replace(now, hedge=True)
    elif args.cases == "self-lookup":
        if args.agreement is not None or texts is None:
            parser.error("self-lookup replays the ranks file's own texts: give one, without --agreement")
        now = Costs(step_ms=1.75 + 1.05, draft_ms=0.60)
        cases = {"streamed K = 6 at the H100's forwards of ca7633b": now}
        cases.update({f"draft forwards confirming {n} lookup tokens": replace(now, self_lookup=n) for n in (2, 4, 8)})
        cases["confirming 4, and hedged on the second choice"] = replace(now, self_lookup=4, hedge=True)
        cases["draft twice as fast (for comparison)"] = replace(now, draft_ms=now.draft_ms / 2)
        # Bursts of confirmed tokens run into the lookahead: the draft mostly waits there.
        for lookahead in (12, 16):
            ahead = replace(now, lookahead=lookahead)
            cases[f"lookahead {lookahead}"] = ahead
            cases[f"lookahead {lookahead}, confirming 4"] = replace(ahead, self_lookup=4)
            cases[f"lookahead {lookahead}, confirming 4, hedged"] = replace(ahead, self_lookup=4, hedge=True)
    elif args.cases == "restart":
        base = Costs(step_ms=3.26, block=4)
        pipelined = replace(base, step_ms=base.step_ms - 0.9, lag_ms=1.7)
        cases = {
            "stream4 as measured (39b9511: 3.26 ms a step)": base,
            "a contradiction also waits for the queued call": replace(base, queued=True),
            "a starved step waits up to 1.5 ms for a draft": replace(base, wait_ms=1.5),
            "Verify pipelined (round trip hidden, drafts 1.7 ms staler)": pipelined,
            "Verify pipelined + hedged": replace(pipelined, hedge=True),
        }
    else:
        cases = {
            "as measured (run 3: 1.35 ms a token, 35% of steps without a draft)": base,
            "hedged on the second choice": replace(base, hedge=True),
            "draft twice as fast": replace(base, draft_ms=base.draft_ms / 2),
            "Verify round trip halved (step 2.65 ms)": replace(base, step_ms=base.step_ms - 0.5),
            "hedged + draft twice as fast": replace(base, hedge=True, draft_ms=base.draft_ms / 2),
            "hedged + draft twice as fast + round trip halved": replace(base, hedge=True, draft_ms=base.draft_ms / 2,
                                                                        step_ms=base.step_ms - 0.5),
        }
    out = {name: {**run(ranks, c, texts), "costs": c.__dict__} for name, c in cases.items()}
    for name, r in out.items():
        print(f"{r['ms_per_token']:6.3f} ms/token  {r['tokens_per_step']:4.2f} tokens/step  "
              f"{100 * r['starved']:3.0f}% starved  {name}")
    if args.out:
        json.dump(out, open(args.out, "w"), indent=2)


if __name__ == "__main__":
    main()
