"""What a benchmark result must say about where it ran."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path


def git_commit() -> str:
    """The checkout's commit; BASS_COMMIT overrides it (on machines that get a copy without .git)."""
    if os.environ.get("BASS_COMMIT"):
        return os.environ["BASS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
