"""Write a .safetensors file one tensor (or row block) at a time.

`safetensors.save_file` needs every tensor in memory at once: about 3.5 GB for the 1.5B target
in bf16, on top of the float32 scratch of dequantization. The format is simple enough to stream
instead: an 8-byte little-endian header length, a JSON header giving each tensor's dtype, shape
and byte range, then the raw bytes in that order. We know every shape before dequantizing
anything, so the header goes first and tensors are appended as they are produced.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

_DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]


class SafetensorsStreamWriter:
    """Header up front, then `write(rows)` calls that must arrive in `entries` order.

    All tensors share one dtype (the conversion's output dtype). `close()` checks every byte
    the header promised was written, so a bug cannot produce a silently short file.
    """

    def __init__(self, path: Path, entries: list[TensorEntry], dtype: torch.dtype, metadata: dict[str, str]):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"unsupported safetensors dtype {dtype}")
        self._dtype = dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        header: dict[str, object] = {"__metadata__": dict(metadata)}
        self._sizes: list[tuple[str, int]] = []
        offset = 0
        for entry in entries:
            nbytes = math.prod(entry.shape) * itemsize
            header[entry.name] = {
                "dtype": _DTYPE_NAMES[dtype],
                "shape": list(entry.shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._sizes.append((entry.name, nbytes))
            offset += nbytes
        self.data_bytes = offset
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)  # the format recommends 8-byte aligned data
        self._file = open(path, "wb")
        self._file.write(struct.pack("<Q", len(blob)))
        self._file.write(blob)
        self._index = 0
        self._left_in_tensor = self._sizes[0][1] if self._sizes else 0

    def write(self, name: str, rows: np.ndarray | torch.Tensor) -> None:
        """Append the next rows (any float dtype; cast here) of tensor `name`."""
        if self._index >= len(self._sizes) or self._sizes[self._index][0] != name:
            raise RuntimeError(f"tensor {name!r} written out of header order")
        if isinstance(rows, np.ndarray):
            rows = np.ascontiguousarray(rows)
            if not rows.flags.writeable:  # F32 GGUF tensors are read-only views of the mmap
                rows = rows.copy()
            rows = torch.from_numpy(rows)
        t = rows
        raw = t.to(self._dtype).contiguous().reshape(-1).view(torch.uint8).numpy()
        if raw.nbytes > self._left_in_tensor:
            raise RuntimeError(f"tensor {name!r}: more data than its header shape")
        self._file.write(memoryview(raw))
        self._left_in_tensor -= raw.nbytes
        if self._left_in_tensor == 0:
            self._index += 1
            if self._index < len(self._sizes):
                self._left_in_tensor = self._sizes[self._index][1]

    def close(self) -> None:
        self._file.close()
        if self._index != len(self._sizes):
            missing = self._sizes[self._index][0]
            raise RuntimeError(f"safetensors file incomplete: tensor {missing!r} not fully written")

    def abort(self) -> None:
        self._file.close()
