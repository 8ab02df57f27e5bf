"""The few-row product kernels compile for an H100 (sm_90), on a machine without a GPU.

CPU tests run them in Triton's interpreter, which never compiles anything, so a kernel the real
compiler rejects (a type mismatch in a branch, an unsupported cast, a helper returning the wrong
shapes) would pass CI and fail on the first GPU call. tests/kernel_builds.py compiles each
variant the product launches (Triton IR, PTX, and a cubin through Triton's bundled ptxas) in a
process of its own, since this one has Triton in interpreter mode.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def _ptxas_bundled() -> bool:
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file()


@pytest.mark.skipif(not _ptxas_bundled(), reason="this Triton build bundles no ptxas")
def test_the_int8_k_quant_and_megakernel_kernels_compile_for_sm90():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("kernel_builds.py"))], env=env,
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # int8: 4 shapes x 2 outputs; the draft megakernel; k-quant: 2 formats x 4 x 2 x 2
    assert len(lines) == 8 + 1 + 2 * 4 * 2 * 2
    failed = [line for line in lines if not line["ok"]]
    assert not failed, failed
