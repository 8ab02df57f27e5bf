"""Host values onto the GPU without making the host wait for it.

A copy from ordinary (pageable) host memory synchronizes the CUDA stream before it starts, so
every small `torch.tensor(values, device="cuda")` in a step stalls the host until the GPU has
finished everything queued before it, and the GPU then idles while the host prepares what
comes next. Staged through pinned memory the copy is queued like a kernel. PyTorch's pinned
allocator keeps a staging block until the copy that reads it has run, so the host may go on at
once.
"""

from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` (a list or a CPU tensor) as a `dtype` tensor on `device`, copied asynchronously."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
