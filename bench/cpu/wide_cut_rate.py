"""How often a sampled row of the real pair needs race_first's exact rounds, position by position.

kernels/triton_race_first.race_first decides a sampled row in its first passes where the race's
winner is the most likely token or the top-p cut keeps it; else from the tokens above the winner
(at most 256 of them: the buffer); else from the tokens above one of 16 thresholds under the top
that holds the cut within the buffer; else, for the target, by racing again above each winner
the cut drops (the exact rounds, ~0.25 ms a round on an H100 for one program), while the draft's
proposal keeps its winner (exact=False). This counts, with the real pair in fp32 on the CPU, how
often each path decides a row: the target samples each HumanEval prompt (T, top-p), one forward
of each model over prompt and output gives its distribution at every generated position, and
each position is raced under `--draws` independent noises (the race's keys are uniform, so the
paths' shares are those of the product's steps). A verification also computes rows past a draft
the target rejects, conditioned on that wrong token (discarded, but raced all the same): with
`--after-rejections`, at each position where the draft's first draw differs from the target's
token, the target's row after the draft's token is classified too ("target after a rejection").

    .venv/bin/python bench/cpu/wide_cut_rate.py [--problems 0:8] [--new 128] [--out FILE]
    (after `make models`; ~5 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bass.app.humaneval_problems import load_problems, select
from bass.coordinator.tokenizer import load_codec

from draft_agreement import MODELS, load  # noqa: E402 - bench/cpu is the script's own directory

BUFFER = 256  # race_first's _ABOVE_BUFFER
DEPTHS = [0.5 * (j + 1) + 0.04 * (j + 1) ** 2 for j in range(16)]  # race_first's _band_depth
PATHS = ("most likely", "kept by the cut", "buffer", "thresholds", "exact rounds")


def classify(scaled: torch.Tensor, top_p: float, noise: torch.Tensor) -> tuple[list[str], list[int]]:
    """scaled [P, V] (logits / T), noise [D, P, V] Gumbel: each (draw, position)'s path, and for
    rows of the exact rounds how many rounds it takes (races until the cut keeps the winner)."""
    probs = torch.softmax(scaled, dim=-1)
    top = scaled.max(dim=-1).values
    paths, rounds = [], []
    for draw in noise:
        for p in range(scaled.shape[0]):
            row, mass = scaled[p], probs[p]
            score = row + draw[p]
            winner = int(score.argmax())
            value = row[winner]
            if value >= top[p]:
                paths.append(PATHS[0])
                continue
            above = row > value
            if float(mass[above].sum()) < top_p:
                paths.append(PATHS[1])
                continue
            if int(above.sum()) <= BUFFER:
                paths.append(PATHS[2])
                continue
            if any(float(mass[row > top[p] - d].sum()) >= top_p and int((row > top[p] - d).sum()) <= BUFFER
                   for d in DEPTHS):
                paths.append(PATHS[3])
                continue
            paths.append(PATHS[4])
            n, floor = 1, value
            while True:  # race again above the dropped winner until the cut keeps it
                score_above = torch.where(row > floor, score, float("-inf"))
                w = int(score_above.argmax())
                if float(mass[row > row[w]].sum()) < top_p:
                    break
                n, floor = n + 1, row[w]
            rounds.append(n)
    return paths, rounds


def gumbel(draws: int, shape) -> torch.Tensor:
    u = torch.rand(draws, *shape).clamp_(1e-12, 1 - 1e-7)
    return -torch.log(-torch.log(u))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", default="0:8")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--after-rejections", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    codec = load_codec(f"{MODELS}/qwen2.5-coder-1.5b-instruct")
    models = {"target": load("qwen2.5-coder-1.5b-instruct"), "draft": load("qwen2.5-coder-0.5b-instruct")}
    kinds = list(models) + (["target after a rejection"] if args.after_rejections else [])
    counts = {name: dict.fromkeys(PATHS, 0) for name in kinds}
    rounds: dict[str, list[int]] = {name: [] for name in kinds}
    rows_of = dict.fromkeys(kinds, 0)
    started, positions = time.perf_counter(), 0
    for problem in select(load_problems(), args.problems):
        prompt = codec.encode(problem["prompt"])
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            out = models["target"].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                            do_sample=True, temperature=args.temperature, top_p=args.top_p,
                                            top_k=0, pad_token_id=0)
            generated = out.shape[1] - len(prompt)
            positions += generated
            noise = None
            drafted = None
            for name, model in models.items():
                logits = model(out).logits[0, len(prompt) - 1:len(prompt) - 1 + generated].float()
                if noise is None:
                    noise = gumbel(args.draws, logits.shape)
                paths, n = classify(logits / args.temperature, args.top_p, noise)
                for path in paths:
                    counts[name][path] += 1
                rounds[name] += n
                rows_of[name] += len(paths)
                if name == "draft":  # its first draw's proposals (no cut: close enough for this)
                    drafted = (logits / args.temperature + noise[0]).argmax(dim=-1)
            if args.after_rejections:
                name = "target after a rejection"
                taken = out[0, len(prompt):]
                for i in (drafted != taken).nonzero().flatten().tolist():
                    wrong = torch.cat([out[0, :len(prompt) + i], drafted[i:i + 1]])[None]
                    row = models["target"](wrong).logits[0, -1:].float()
                    paths, n = classify(row / args.temperature, args.top_p, gumbel(args.draws, row.shape))
                    for path in paths:
                        counts[name][path] += 1
                    rounds[name] += n
                    rows_of[name] += len(paths)
        print(f"{problem['task_id']}: {generated} tokens, {json.dumps(counts)}", flush=True)
    result = {"benchmark": "wide_cut_rate", "problems": args.problems, "new_tokens": args.new,
              "temperature": args.temperature, "top_p": args.top_p, "positions": positions, "draws": args.draws,
              "rows": rows_of,
              "share_of_rows": {name: {path: round(c / max(1, rows_of[name]), 5) for path, c in by_path.items()}
                                for name, by_path in counts.items()},
              "exact_rounds_mean": {name: round(sum(r) / len(r), 2) if r else None for name, r in rounds.items()},
              "exact_rounds_max": {name: max(r, default=0) for name, r in rounds.items()},
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
