"""Timing GPU work as CUDA graphs replay it: what a kernel costs inside a decode step, launch gaps
included, without the host's launch overhead. Used by the few-row planning at model load
(kernels/skinny_linear.py), the choice of layer path per captured step (engine/graphs.py) and
the kernel benchmarks (bench/gpu/kernels/)."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def graph_us(fn: Callable[[], object], calls: int = 1, replays: int = 20, rounds: int = 5) -> float:
    """µs per call of fn, which makes `calls` calls, captured in a CUDA graph (warmed up on a side
    stream first): the median over `rounds` timings of `replays` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return replay_us(graph, replays, rounds) / calls


def replay_us(graph: torch.cuda.CUDAGraph, replays: int = 20, rounds: int = 5) -> float:
    """µs per replay of a captured graph (after one untimed replay): the median over `rounds`
    timings of `replays` replays back to back."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(times)
