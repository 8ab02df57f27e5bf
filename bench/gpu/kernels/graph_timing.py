"""µs per call of GPU work captured in a CUDA graph: the timing of the few-row kernel benchmarks
(int8_linear.py here; the retired skinny_gemm.py and weight_only_gemm.py used it too). Imported
by its neighbours as a plain module: run them as `python bench/gpu/kernels/NAME.py`."""

from __future__ import annotations

import statistics

import torch


def graph_us(fn, calls: int = 1, replays: int = 20) -> float:
    """µs per call of fn, which makes `calls` calls, captured in a CUDA graph (warmed up on a side
    stream first): the median of 5 timings of `replays` replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / replays / calls)
    return statistics.median(times)
