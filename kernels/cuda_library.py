"""The CUDA C++ kernel library (kernels/cuda/*.cu), built on the machine that runs it.

Built once per machine with the CUDA compiler (`nvcc`, found on PATH or under CUDA_HOME) into
BASS_KERNEL_CACHE (default ~/.cache/bass/kernels), one shared library of every source, keyed by
the sources' hash and the GPU's architecture, and loaded with ctypes: kernels/cuda_skinny.py and
kernels/cuda_attention.py wrap its entry points. `bass build-kernels` builds it ahead of the first
load; deploy/docker/Dockerfile's kernels stage builds it into the image. Where there is no
compiler, no GPU or the build fails, loading returns None (logged) and callers keep their
Triton / cuBLAS paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).with_name("cuda")


def sources() -> list[Path]:
    """Every kernel source, in name order (the order the library's hash reads them in)."""
    return sorted(SOURCE_DIR.glob("*.cu"))


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home, "bin", "nvcc") if home else None
    return str(candidate) if candidate is not None and candidate.exists() else None


def cache_dir() -> Path:
    return Path(os.environ.get("BASS_KERNEL_CACHE", Path.home() / ".cache" / "bass" / "kernels"))


def library_name(arch: str) -> str:
    """The built library's file name: the sources' hash (changed sources are rebuilt) and the GPU
    architecture. deploy/docker/Dockerfile's kernels stage builds the same names."""
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources())).hexdigest()[:16]
    return f"bass_kernels-{digest}-sm{arch}.so"


def load_for_device(device: torch.device, fallback: str) -> ctypes.CDLL | None:
    """The library for `device`'s architecture; None on a CPU or a GPU older than Ampere (bf16
    tensor cores), or where load_library gives none. fallback: what the caller does then (logged)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return None
    return load_library(f"{major}{minor}", fallback)


def load_library(arch: str, fallback: str = "the models keep their Triton / cuBLAS paths") -> ctypes.CDLL | None:
    """The library built for sm_`arch` from the cache, compiled into it first where it is not
    there; None (with a warning naming `fallback`) where that cannot be done: no nvcc, a compiler
    error, a cache that cannot be written or a file that does not load."""
    target = cache_dir() / library_name(arch)
    try:
        if not target.exists():
            nvcc = find_nvcc()
            if nvcc is None:
                log.warning("no nvcc on PATH or under CUDA_HOME: %s", fallback)
                return None
            log.info("compiling the CUDA kernels for sm_%s into %s (once per machine, ~30 s)", arch, target)
            started = time.monotonic()
            error = build_library(nvcc, arch, target)
            if error is not None:
                log.warning("building the CUDA kernels failed; %s:\n%s", fallback, error)
                return None
            log.info("compiled the CUDA kernels in %.1f s", time.monotonic() - started)
        return ctypes.CDLL(str(target))
    except OSError as exc:  # an unwritable cache (BASS_KERNEL_CACHE), a truncated library
        log.warning("CUDA kernels unavailable (%s); %s", exc, fallback)
        return None


def build_library(nvcc: str, arch: str, target: Path) -> str | None:
    """Compile every source for sm_`arch` into the shared library `target`; the compiler's error
    output where it fails, else None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
               "-o", str(built), *map(str, sources())]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            return result.stderr[-2000:] or f"nvcc exited with {result.returncode}"
        os.replace(built, target)  # atomic: a concurrent loader sees the whole file or none
    return None
