#!/usr/bin/env python3
"""Rewrite the JSON files under bench/results (or the given files and folders) on one line each:
the same data, a third of the bytes.

bench/results travels to the GPU machine with every device call, in the same 64 MiB as a model
part (bench/gpu/README.md), so results are committed compact; tests/test_results_files.py fails
on an indented one. Run it after copying a run's files in, before committing:

    python3 bench/compact_results.py [PATH ...]      # default: bench/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compact(path: Path) -> bool:
    """Rewrite one file compactly; whether it changed. Raises on a file that is not JSON."""
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    new = json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def main(args: list[str]) -> int:
    targets = [Path(a) for a in args] or [ROOT / "bench" / "results"]
    files = [f for t in targets for f in (sorted(t.rglob("*.json")) if t.is_dir() else [t])]
    changed = sum(compact(f) for f in files)
    print(f"{changed} of {len(files)} JSON file(s) rewritten on one line")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
