"""bench/results travels to the GPU machine with every device call, in the same 64 MiB as the
model's parts (bench/gpu/README.md, "Setting up"): its JSON files are kept on one line each.
Indented, they were half of the tracked tree (6.7 of 19 MB on 2026-11-28)."""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_results_json() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.splitlines() if name.endswith(".json")]


def test_results_json_files_are_compact():
    files = tracked_results_json()
    assert files, "bench/results has JSON files"
    loose = [str(f.relative_to(ROOT)) for f in files if f.read_text(encoding="utf-8").rstrip("\n").count("\n")]
    assert not loose, (f"{len(loose)} JSON file(s) under bench/results span several lines, e.g. {loose[:3]}: "
                       "run `python3 bench/compact_results.py` (or write them with json.dump(data, f, "
                       "separators=(',', ':')))")


def test_results_json_files_parse():
    for f in tracked_results_json():
        json.loads(f.read_text(encoding="utf-8"))
