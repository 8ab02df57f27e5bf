"""The CUDA kernel library (kernels/cuda_library.py): built from every source under kernels/cuda
by `bass build-kernels` or at the first load, under the name the loader and the Docker image
use; no library, and a warning, where it cannot be built or loaded."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

CUDA = torch.cuda.is_available()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
def test_build_kernels_compiles_for_hopper_into_the_cache_the_loader_reads(tmp_path, monkeypatch):
    """`bass build-kernels --arch 90` on a machine without a GPU: the sources compile, the library
    exports their entry points, lands under the name the loader looks for, and is not rebuilt."""
    from click.testing import CliRunner

    from bass.app.cli import main
    from bass.kernels.cuda_library import library_name, load_library

    monkeypatch.setenv("BASS_KERNEL_CACHE", str(tmp_path))
    first = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert first.exit_code == 0, first.output
    assert str(tmp_path / library_name("90")) in first.output
    assert (tmp_path / library_name("90")).is_file() and load_library("90") is not None
    library = ctypes.CDLL(str(tmp_path / library_name("90")))
    assert hasattr(library, "bass_skinny_gemm") and hasattr(library, "bass_decode_attention")
    again = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert again.exit_code == 0 and "already built" in again.output


def test_build_kernels_says_what_is_missing(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import bass.kernels.cuda_library as cuda_library
    from bass.app.cli import main

    bad = CliRunner().invoke(main, ["build-kernels", "--arch", "7x"])
    assert bad.exit_code == 2 and "compute capability" in bad.output
    old = CliRunner().invoke(main, ["build-kernels", "--arch", "75"])
    assert old.exit_code == 2 and "80 or more" in old.output
    if not CUDA:
        no_gpu = CliRunner().invoke(main, ["build-kernels"])
        assert no_gpu.exit_code == 2 and "--arch" in no_gpu.output
    monkeypatch.setattr(cuda_library, "find_nvcc", lambda: None)
    no_nvcc = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert no_nvcc.exit_code == 1 and "no nvcc" in no_nvcc.output


def test_a_cache_that_cannot_be_written_or_read_leaves_the_fallback(tmp_path, monkeypatch, caplog):
    """No kernel, a warning, and no error for the model that asked: an unwritable cache (a path
    under a file) and a library file that does not load."""
    import bass.kernels.cuda_library as cuda_library
    from bass.kernels.cuda_library import library_name, load_library

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BASS_KERNEL_CACHE", str(blocker / "kernels"))
    monkeypatch.setattr(cuda_library, "find_nvcc", lambda: "/nonexistent/nvcc")  # the cache fails before it runs
    assert load_library("90") is None
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / library_name("90")).write_bytes(b"not a shared library")
    monkeypatch.setenv("BASS_KERNEL_CACHE", str(cache))
    assert load_library("90") is None
    assert "unavailable" in caplog.text and "Triton / cuBLAS" in caplog.text
