"""Filesystem helpers shared by fetch and convert: free-space checks and atomic publishing.

Both steps write gigabytes. They write into a hidden temporary name beside the destination and
rename at the end, so an interrupted run never leaves something at the final path that looks
complete; a crash leaves only a `.NAME.partial-*` entry, which nothing ever reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import ModelSetupError, NotEnoughDiskSpaceError

# Headroom on top of a step's own estimate: filesystem metadata, tokenizer files, rounding.
_DISK_MARGIN_BYTES = 64 * 1024 * 1024

# A directory we are willing to replace must look like an earlier conversion of ours; this
# stops `convert-gguf x.gguf ~` from deleting a home directory.
_MODEL_DIR_SIGNATURE = ("config.json",)


def ensure_free_space(directory: Path, needed_bytes: int, what: str) -> None:
    """Raise NotEnoughDiskSpaceError unless `directory`'s filesystem has room for `needed_bytes`."""
    probe = Path(directory)
    while not probe.exists():  # the directory may not exist yet; measure its closest ancestor
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed_bytes + _DISK_MARGIN_BYTES:
        raise NotEnoughDiskSpaceError(
            f"not enough disk space for {what}: need about {_gib(needed_bytes + _DISK_MARGIN_BYTES)} "
            f"in {directory}, only {_gib(free)} free"
        )


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small file so readers see either the old content or all of the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temp directory that becomes `out_dir` only if the block finishes.

    An existing `out_dir` is replaced when it is empty, or when `overwrite` is set and it looks
    like a model directory; anything else is refused before any work is done.
    """
    out_dir = Path(out_dir).absolute()
    _check_replaceable(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~_current_umask())  # mkdtemp makes it 0700; publish with normal perms
    try:
        yield tmp
        _fsync_tree(tmp)
        if out_dir.exists():
            # Swap rather than delete-then-rename, so the old copy stays usable until the end.
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "d")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_replaceable(out_dir: Path, overwrite: bool) -> None:
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ModelSetupError(f"output path {out_dir} exists and is not a directory")
    entries = list(out_dir.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ModelSetupError(f"output directory {out_dir} is not empty (pass overwrite to replace it)")
    if not all((out_dir / name).is_file() for name in _MODEL_DIR_SIGNATURE):
        raise ModelSetupError(
            f"refusing to replace {out_dir}: it is not empty and does not look like a model directory"
        )


def _fsync_tree(root: Path) -> None:
    # Data must be on disk before the rename publishes it, or a power cut could expose a
    # complete-looking directory with truncated files.
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
