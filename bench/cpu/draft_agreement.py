"""How often the draft's first, second and third choices are the target's greedy token, position by position.

Streamed speculation (issue #36) loses most of its time where the target contradicts the draft:
the draft's tokens past that point are dropped and the sequence waits for new ones. A draft that
also drafted a branch from its second choice at each unverified position would lose nothing where
the target's token is that second choice. This measures how often that is, with the real pair, on
the CPU (fp32: the numbers are the models', not a GPU's): the target decodes each prompt greedily,
(up to --new tokens, or its end of text), then one draft forward over prompt and output gives the
draft's ranking at every generated position. Also: the runs of agreement between contradictions
(what a draft running ahead keeps), and how many of 4 lookup stand-ins
(coordinator/lookup_drafts.py) the target would take at every position and right after each
contradiction (where a streamed step finds no draft and verifies them).

    .venv/bin/python bench/cpu/draft_agreement.py [--problems 0:16] [--new 128] [--out FILE]
    (after `make models`; ~5 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from bass.app.humaneval_problems import load_problems, select
from bass.core.config import LOOKUP_WINDOW
from bass.coordinator.lookup_drafts import NgramIndex
from bass.coordinator.tokenizer import load_codec

MODELS = os.path.expanduser("~/.cache/bass/models")


def load(name: str):
    model = AutoModelForCausalLM.from_pretrained(f"{MODELS}/{name}", dtype=torch.float32)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", default="0:16")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--out")
    parser.add_argument("--ranks-out", help="also write each prompt's per-token ranks, its prompt and the "
                                            "target's tokens (JSON lists), for bench/cpu/stream_model.py "
                                            "and bench/cpu/drafter_model.py")
    args = parser.parse_args()
    torch.manual_seed(0)
    codec = load_codec(f"{MODELS}/qwen2.5-coder-1.5b-instruct")
    target, draft = load("qwen2.5-coder-1.5b-instruct"), load("qwen2.5-coder-0.5b-instruct")
    ranks: list[int] = []  # per generated token: the target's token's rank among the draft's (0 = first), capped at 3
    runs: list[int] = []  # lengths of agreement between the draft's first choice and the target
    per_prompt: list[list[int]] = []
    texts: list[dict] = []  # per prompt: its tokens and the target's greedy tokens
    lookup_all: list[int] = []  # per generated position: lookup stand-ins (of 4) the target's text takes
    lookup_after_miss: list[int] = []  # the same, at the position right after the draft's first choice missed
    started = time.perf_counter()
    for problem in select(load_problems(), args.problems):
        prompt = codec.encode(problem["prompt"])
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                  do_sample=False, pad_token_id=0)
            generated = out[0, len(prompt):].tolist()
            texts.append({"prompt": prompt, "generated": generated})
            logits = draft(out).logits[0, len(prompt) - 1:len(prompt) - 1 + len(generated)]
        top = logits.topk(3, dim=-1).indices.tolist()
        index = NgramIndex(3)
        index.extend(prompt[-LOOKUP_WINDOW:])
        for i, token in enumerate(generated):
            taken = 0
            for j, proposed in enumerate(index.continuation(index.tokens, 4)):
                if i + j >= len(generated) or generated[i + j] != proposed:
                    break
                taken += 1
            lookup_all.append(taken)
            if i and generated[i - 1] not in top[i - 1][:1]:
                lookup_after_miss.append(taken)
            index.extend([token])
        per_prompt.append([])
        run = 0
        for token, choices in zip(generated, top):
            rank = choices.index(token) if token in choices else 3
            ranks.append(rank)
            per_prompt[-1].append(rank)
            if rank == 0:
                run += 1
            else:
                runs.append(run)
                run = 0
        runs.append(run)
    n = len(ranks)
    missed = [r for r in ranks if r > 0]
    result = {
        "benchmark": "draft_agreement", "problems": args.problems, "new_tokens": args.new, "tokens": n,
        "first_choice": round(ranks.count(0) / n, 4),
        "second_choice_where_first_missed": round(missed.count(1) / len(missed), 4) if missed else None,
        "third_choice_where_first_two_missed": round(missed.count(2) / max(1, len(missed) - missed.count(1)), 4),
        "top2": round(sum(r <= 1 for r in ranks) / n, 4), "top3": round(sum(r <= 2 for r in ranks) / n, 4),
        "agreement_run_median": statistics.median(runs), "agreement_run_mean": round(statistics.mean(runs), 2),
        "lookup_taken_of_4": round(statistics.fmean(lookup_all), 3),
        "lookup_taken_of_4_after_a_miss": round(statistics.fmean(lookup_after_miss), 3) if lookup_after_miss else None,
        "positions_after_a_miss": len(lookup_after_miss),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.ranks_out:
        with open(args.ranks_out, "w") as f:
            json.dump({"problems": args.problems, "ranks": per_prompt, "texts": texts}, f)


if __name__ == "__main__":
    main()
