"""The in-process workers the profiling scripts run `bass bench speed`'s cases on.

A CASE is MODE:BATCH:POLICY (e.g. greedy:8:3). Imported by the scripts beside it, which run as
files (`python3 bench/gpu/profiling/NAME.py ...`), so this folder is on their path.
"""

from __future__ import annotations

from pathlib import Path

from bass.app.humaneval_problems import load_problems, select
from bass.app.local import build_local_workers
from bass.core.config import RunnerConfig
from bass.coordinator.tokenizer import load_codec


def parse_cases(args: list[str]) -> list[tuple[str, int, str]]:
    cases = []
    for arg in args:
        mode, batch, policy = arg.split(":")
        cases.append((mode, int(batch), policy))
    return cases


def case_workers(target: str, draft: str, cases: list[tuple[str, int, str]], device: str):
    """(target worker, draft worker, codec, the bench's 16 prompts), with slots for the largest
    case: bf16 and the Triton kernels on CUDA, fp32 and the PyTorch attention on the CPU."""
    runner = dict(device=device, dtype="bfloat16" if device == "cuda" else "float32",
                  num_slots=max(batch for _, batch, _ in cases), max_seq_len=1024,
                  attention="triton" if device == "cuda" else "pad")
    prompts = [p["prompt"] for p in select(load_problems(), "0:16")]
    target_worker, draft_worker = build_local_workers(RunnerConfig(model_dir=target, **runner),
                                                      RunnerConfig(model_dir=draft, **runner))
    return target_worker, draft_worker, load_codec(Path(target)), prompts
