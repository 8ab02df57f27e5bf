"""engine.runner.use_device: a service makes its model's device current in every thread that runs
the model (CUDA's current device is per thread). Only an indexed device is made current: "cuda"
alone is the default device, and torch refuses to set it (every service on a GPU failed to start
when it was passed through)."""

import torch

from bass.engine import runner


def test_only_an_indexed_cuda_device_is_made_current(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
    for device in ("cpu", "cuda", "cuda:1", "cuda:0"):
        runner.use_device(device)
    assert calls == [torch.device("cuda:1"), torch.device("cuda:0")]


def test_nothing_happens_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: (_ for _ in ()).throw(AssertionError("called")))
    runner.use_device("cuda:1")
