"""The few-row int8 product kernel compiles for an H100 (sm_90), on a machine without a GPU.

CPU tests run it in Triton's interpreter, which never compiles anything, so a kernel the real
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
def test_the_int8_kernel_compiles_for_sm90():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("kernel_builds.py"))], env=env,
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 8  # 4 shapes x 2 outputs
    failed = [line for line in lines if not line["ok"]]
    assert not failed, failed
