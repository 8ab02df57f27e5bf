"""What a benchmark result must say about where it ran."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path


_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the bass package: bass/app/bench/environment.py
# Written beside the installed package by bench/gpu/setup/install.sh from the wheel's build
# (bench/gpu/setup/prepare.sh): the GPU machine gets the wheel without the checkout's .git.
BUILD_COMMIT_FILE = "BUILD_COMMIT"


def git_commit(package_dir: Path = _PACKAGE_DIR) -> str:
    """The commit the running code is from: BASS_COMMIT if set, else the checkout's (with
    "-dirty" for uncommitted changes), else the one recorded beside an installed wheel
    (BUILD_COMMIT_FILE), else "unknown"."""
    if os.environ.get("BASS_COMMIT"):
        return os.environ["BASS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=package_dir, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, cwd=package_dir, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    recorded = package_dir / BUILD_COMMIT_FILE
    return recorded.read_text().strip() or "unknown" if recorded.is_file() else "unknown"


def describe(device: str) -> dict:
    import torch

    info = {"time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
            "python": platform.python_version(), "torch": torch.__version__, "device": device,
            "command": " ".join(sys.argv)}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info
