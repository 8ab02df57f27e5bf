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


class HostCopy:
    """A device tensor on its way to the host: the copy is queued behind the work that makes the
    tensor, so the host goes on queueing (the next model's forward) instead of waiting for it;
    `tolist` waits for that copy alone, not for what was queued after it."""

    def __init__(self, values: torch.Tensor):
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.done: torch.cuda.Event | None = torch.cuda.Event()
            self.done.record()
        else:  # a copy now, as the GPU's is queued now: the tensor may be a view the next call overwrites
            self.host, self.done = values.clone(), None

    def ready(self) -> bool:
        """Whether `tolist` can answer without waiting for the GPU."""
        return self.done is None or self.done.query()

    def tolist(self) -> list:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


class Staging:
    """A pinned host buffer and its device twin, for values the host writes before each launch
    (the inputs a CUDA graph reads from the twin). The host may queue launches ahead of the GPU
    (a draft's steps, the target's verification behind them), so `load` waits for the last copy
    out of the host buffer to have run before overwriting it."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device | str):
        self.device = torch.zeros(numel, dtype=dtype, device=device)
        self.host = torch.zeros(numel, dtype=dtype, pin_memory=self.device.is_cuda)
        self._copied: torch.cuda.Event | None = None

    def load(self, values: torch.Tensor) -> torch.Tensor:
        """Copy values (host, numel elements) to the device twin, asynchronously; returns it."""
        if self._copied is not None:
            self._copied.synchronize()
        self.host.copy_(values)
        self.device.copy_(self.host, non_blocking=True)
        if self.device.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return self.device
