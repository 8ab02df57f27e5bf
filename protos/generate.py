"""Generate the Python gRPC code for protos/bass/v1/*.proto into bass/v1/ (not committed).

Run by `make` at install time. Writes GENERATED_FROM beside the code: the sha256 of every
.proto source and the grpcio-tools version, which tests compare against the sources to prove
the generated code is current.

    python protos/generate.py [--check]
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = ROOT / "bass" / "v1"
STAMP = "GENERATED_FROM"


def sources() -> list[Path]:
    return sorted((PROTO_ROOT / "bass" / "v1").glob("*.proto"))


def fingerprint() -> dict:
    return {"grpcio_tools": version("grpcio-tools"),
            "protos": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sources()}}


def generate(out_root: Path) -> None:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out_root}", f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}", *map(str, sources())]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    pkg = out_root / "bass" / "v1"
    (pkg / "__init__.py").write_text('"""Generated from protos/bass/v1 by protos/generate.py; do not edit."""\n')
    (pkg / STAMP).write_text(json.dumps(fingerprint(), indent=1, sort_keys=True) + "\n")


def is_current() -> bool:
    stamp = OUT_PACKAGE / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()) == fingerprint()


def main() -> None:
    if "--check" in sys.argv:
        if not is_current():
            raise SystemExit("bass/v1 is missing or stale: run `python protos/generate.py` (make does it)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        shutil.rmtree(OUT_PACKAGE, ignore_errors=True)
        shutil.copytree(Path(tmp) / "bass" / "v1", OUT_PACKAGE)
    print(f"generated {OUT_PACKAGE.relative_to(ROOT)} from {len(sources())} protos")


if __name__ == "__main__":
    main()
