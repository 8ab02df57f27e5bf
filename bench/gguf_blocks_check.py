"""Convert a GGUF and check that every k-quant block the converter keeps (gguf_blocks/) decodes to
the converted checkpoint's tensor bit for bit: the exactness `kquant_weights` rests on, on a real
file rather than the tests' random blocks. CPU is enough; prints one JSON line.

    python bench/gguf_blocks_check.py FILE.gguf OUT_DIR
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open

from bass.engine.weights import GGUF_BLOCKS_FILE
from bass.kernels.triton_kquant import KQuantWeight
from bass.models.gguf_convert import convert_gguf


def main(gguf: Path, out: Path) -> None:
    started = time.monotonic()
    convert_gguf(gguf, out, progress=False, overwrite=True)
    convert_s = time.monotonic() - started
    with safe_open(str(out / GGUF_BLOCKS_FILE), "pt") as blocks, safe_open(str(out / "model.safetensors"), "pt") as m:
        formats = blocks.metadata()
        names = sorted(blocks.keys())
        mismatched = [n for n in names
                      if not torch.equal(KQuantWeight.from_gguf_blocks(formats[n], blocks.get_tensor(n)).full,
                                         m.get_tensor(n))]
    print(json.dumps({"gguf": gguf.name, "convert_s": round(convert_s, 1), "tensors": len(names),
                      "formats": dict(Counter(formats[n] for n in names)),
                      "blocks_mb": round((out / GGUF_BLOCKS_FILE).stat().st_size / 1e6, 1),
                      "mismatched": mismatched}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
