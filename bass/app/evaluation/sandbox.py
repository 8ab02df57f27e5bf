"""Run untrusted generated code: a separate process per program, never the service's.

Each program runs as `python -I` in a fresh temporary directory, in its own session (so the
whole process group can be killed), with a wall-clock timeout, CPU-time, address-space,
file-size and process-count limits, and no network: in a new network namespace where
`unshare --net` works (root, Linux), and in any case with socket creation disabled before the
program starts.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs before the program: no new sockets, whatever the namespace.
_PRELUDE = """
import socket as _s
def _no_network(*a, **k):
    raise OSError("network access is disabled in the sandbox")
_s.socket = _no_network
_s.create_connection = _no_network
del _s
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    cpu_s: int = 10
    max_processes: int = 64
    max_file_bytes: int = 16 << 20


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str  # "passed", "failed", "timeout", or the error's last line


def _network_isolation() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--net", "true"], capture_output=True).returncode == 0:
        return [unshare, "--net"]
    return []


_ISOLATE = None


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> Outcome:
    global _ISOLATE
    if _ISOLATE is None:
        _ISOLATE = _network_isolation()

    def limit() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))

    with tempfile.TemporaryDirectory(prefix="bass-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(_PRELUDE + "\n" + source)
        proc = subprocess.Popen([*_ISOLATE, sys.executable, "-I", path], cwd=tmp, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=limit, env={"PATH": "/usr/bin:/bin", "HOME": tmp})
        try:
            _, err = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Outcome(False, "timeout")
    if proc.returncode == 0:
        return Outcome(True, "passed")
    last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return Outcome(False, last[0][:200])


def humaneval_program(problem: dict, completion: str) -> str:
    return f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
