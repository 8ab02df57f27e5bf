"""Run untrusted generated code: a separate process per program, never the service's.

Each program runs as `python -I` in a fresh temporary directory, in its own session (so the
whole process group can be killed), with a wall-clock timeout, CPU-time, address-space,
file-size and process-count limits, and no network: in a new network namespace where
`unshare --net` works (root, Linux), and in any case with socket creation disabled before the
program starts.
"""

from __future__ import annotations

import functools
import os
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


# Sets the limits in the program's own process, then becomes the program. Not preexec_fn: that
# runs Python between fork and exec in the caller's child, which is unsafe in a threaded process
# (the evaluation runs programs from a thread pool; a child crashed once in the interpreter's
# at-fork hooks, CI 2026-11-27).
_LAUNCHER = """
import os, resource, sys
memory, cpu, file_bytes, processes = (int(v) for v in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
os.execv(sys.executable, [sys.executable, "-I", sys.argv[5]])
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


@functools.cache
def _network_isolation() -> tuple[str, ...]:
    """`unshare --net` where it works here (root, Linux), asked once."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--net", "true"], capture_output=True).returncode == 0:
        return (unshare, "--net")
    return ()


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="bass-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(_PRELUDE + "\n" + source)
        limit_args = [str(v) for v in (limits.memory_bytes, limits.cpu_s, limits.max_file_bytes, limits.max_processes)]
        command = [*_network_isolation(), sys.executable, "-I", "-c", _LAUNCHER, *limit_args, path]
        proc = subprocess.Popen(command, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={"PATH": "/usr/bin:/bin", "HOME": tmp})
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
