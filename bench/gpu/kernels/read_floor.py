"""What a kernel costs inside a CUDA graph before it computes anything: an empty kernel (the
boundary between two launches) and a kernel that only streams N bytes (16-byte loads, several in
flight a lane), for the byte counts of the pair's projections. The floor under
bench/gpu/kernels/skinny_gemm.py's products.

On a GPU (builds cuda/read_floor.cu with nvcc):
    python bench/gpu/kernels/read_floor.py OUT.json
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from graph_timing import graph_us

SIZES_MB = {"draft qkv int8": 1.03, "draft gate_up int8": 8.72, "draft down int8": 4.36, "target qkv": 6.29,
            "target o": 4.72, "target down": 27.5, "target gate_up": 55.1, "target lm_head": 466.7}


def main() -> None:
    src = Path(__file__).with_name("cuda") / "read_floor.cu"
    so = Path(tempfile.mkdtemp()) / "read_floor.so"
    major, minor = torch.cuda.get_device_capability()
    subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC",
                    f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.bass_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p] + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    lib.bass_empty.argtypes = [ctypes.c_void_p]
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report = {"device": torch.cuda.get_device_name(), "empty_us": graph_us(lambda: [lib.bass_empty(stream()) for _ in range(100)], 100),
              "reads": []}
    print(json.dumps(report), flush=True)
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    for name, mb in SIZES_MB.items():
        nbytes = int(mb * 1e6) // 16 * 16
        copies = max(2, int(200e6 // nbytes) + 1)
        bufs = [torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_() for _ in range(copies)]
        best = None
        for threads in (128, 256, 512):
            for loads in (1, 2, 4, 8):
                for blocks_per_sm in (1, 2, 4, 8, 16):
                    blocks = min(sms * blocks_per_sm, max(1, nbytes // (16 * threads * loads)))
                    if threads * blocks_per_sm > 2048:
                        continue
                    us = graph_us(lambda: [lib.bass_read(b.data_ptr(), nbytes, out.data_ptr(), blocks, threads, loads,
                                                         stream()) for b in bufs], copies)
                    if best is None or us < best[0]:
                        best = (us, threads, loads, blocks)
        row = {"bytes": name, "mb": mb, "best_us": round(best[0], 3), "threads": best[1], "loads": best[2],
               "blocks": best[3], "tb_per_s": round(nbytes / best[0] / 1e6, 2)}
        report["reads"].append(row)
        print(json.dumps(row), flush=True)
        bufs = []  # free them before the next size
    json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
