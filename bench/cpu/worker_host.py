"""The target worker's host work per regular step, without the model: what the GPU waits through
when a step's launch and commit outlast its forward.

On an H100 (in-process, random weights, bench/results 2026-11-28 folded layers) the worker's own
time per regular step, less its wait on the device, was 1.0 ms at 8 sequences and 1.86 ms at 64,
where the whole step took 1.95 and 3.16: host work grows ~15 µs a sequence. This runs the real
TargetWorker's regular path as the coordinator drives it in-process (each step launched, run
ahead of the one before, then that one finished and committed) over a tiny model whose forward is
replaced by a fixed logits tensor, so what is timed is the worker's Python and its tensor ops'
dispatch: staging, the run-ahead checks, the sampling inputs, the race, the verdicts' copy and the
commit. `--profile` prints cProfile's top functions for the largest batch. `--drafts K` times a
step that verifies K drafts a sequence sent from the host instead, as a streamed step's Verify
on two GPUs does (there the worker's host work is on the step's critical path).

On a GPU (`--device cuda --model DIR`, e.g. bench/gpu/setup/random_pair.py's 1.5B) it runs the
served path instead, bf16, CUDA graphs, the real forward: a step's time is then its host work plus
its wait on the device (each answer's device_wait_s), reported apart, and the profile shows where
the host's share goes on the GPU machine's own CPU.

    .venv/bin/python bench/cpu/worker_host.py [--batches 8,64] [--steps 200] [--drafts K] [--profile] [--out FILE]
    python3 bench/cpu/worker_host.py --device cuda --model /tmp/rp/qwen2.5-coder-1.5b-random --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "cpu"))

from rpc_overhead import environment  # noqa: E402


def make_worker(model_dir: Path, batch: int, max_seq_len: int, device: str, drafts: int = 0):
    """A TargetWorker holding `batch` sequences of 32 prompt tokens; on the CPU its model's
    forward is replaced by fixed logits, on a GPU it runs as served (bf16, CUDA graphs).
    drafts: each step verifies this many draft tokens a sequence, sent from the host as a
    streamed step's Verify sends them (coordinator/streamed_step.py; 0: regular steps)."""
    from bass.core.config import RunnerConfig, SamplingParams
    from bass.core.worker_api import AddSequence, SequenceSampling, VerifyItem, VerifyRequest
    from bass.engine.runner import ModelRunner
    from bass.target_service.worker import TargetWorker

    gpu = device != "cpu"
    config = RunnerConfig(model_dir=model_dir, num_slots=batch + 1, max_seq_len=max_seq_len, device=device,
                          dtype="bfloat16" if gpu else "float32")
    worker = TargetWorker(ModelRunner(config))
    if gpu:
        worker.warm_up()
    sampling = SequenceSampling(SamplingParams(), seed_key=1)
    worker.verify(VerifyRequest(items=[VerifyItem(i, (), sampling) for i in range(batch)],
                                add=[AddSequence(i, tuple(range(5, 37))) for i in range(batch)]))
    if not gpu:
        logits = torch.randn(batch * (drafts + 1), worker.runner.vocab_size)
        worker.runner.run = lambda chunks, fed=None: logits[:sum(len(c.tokens) for c in chunks)]
    # The drafts' tokens are never the random logits' winners: each step commits one token.
    step = VerifyRequest(items=[VerifyItem(i, tuple(range(7, 7 + drafts)), sampling) for i in range(batch)])
    return worker, step


def time_steps(worker, step, steps: int) -> tuple[list[float], list[float]]:
    """Per step, seconds, and of them the wait on the device: launch step t + 1 (ahead of t),
    then finish t, as in-process regular decoding does (coordinator/regular_pipeline.py with
    one call in flight). A step with drafts cannot run ahead: it launches after the one before
    finished (the worker finishes that first), as a streamed step's Verify does."""
    times, waits = [], []
    pending = worker.start_verify(step)
    for _ in range(steps):
        started = time.perf_counter()
        following = worker.start_verify(step)
        waits.append(pending.result().device_wait_s)
        times.append(time.perf_counter() - started)
        pending = following
    pending.result()
    return times, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--drafts", type=int, default=0, help="draft tokens verified a sequence a step (0: regular)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", help="a model directory (default: a tiny random Llama, CPU only)")
    parser.add_argument("--out")
    args = parser.parse_args()
    from tiny_models import make_model

    if args.device == "cpu":
        torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else make_model(Path(tmp) / "target")
        batches = [int(b) for b in args.batches.split(",")]
        for batch in batches:
            # One worker for every pass and the profile (on a GPU each loads a model and captures
            # graphs); its caches have room for all their steps.
            worker, step = make_worker(model_dir, batch, 40 + (args.passes + 1) * (args.steps + 20), args.device,
                                       args.drafts)
            steps, waits = [], []
            for _ in range(args.passes):
                time_steps(worker, step, 20)  # warm-up
                times, waited = time_steps(worker, step, args.steps)
                steps.append(1e6 * statistics.median(times))
                waits.append(1e6 * statistics.median(waited))
            entry = {"batch": batch, "drafts": args.drafts, "device": args.device, "steps": args.steps,
                     "step_us_median_per_pass": [round(m, 1) for m in steps],
                     "device_wait_us_median_per_pass": [round(m, 1) for m in waits],
                     "host_us_per_step": round(statistics.median(steps) - statistics.median(waits), 1)}
            if args.profile and batch == max(batches):
                profiler = cProfile.Profile()
                profiler.enable()
                time_steps(worker, step, args.steps)
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                entry["profile_tottime_top25"] = text.getvalue().splitlines()
            results.append(entry)
            print(f"batch {batch}: {entry['host_us_per_step']} µs of worker host work a step of {args.drafts} drafts "
                  f"(step {entry['step_us_median_per_pass']}, device wait {entry['device_wait_us_median_per_pass']})",
                  flush=True)
    if args.profile:
        print("\n".join(results[-1]["profile_tottime_top25"]))
    if args.out:
        device = {"device": args.device, **({"gpu": torch.cuda.get_device_name()} if args.device != "cpu" else {})}
        Path(args.out).write_text(json.dumps({"environment": {**environment(), **device,
                                                              "torch_threads": torch.get_num_threads()},
                                              "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
