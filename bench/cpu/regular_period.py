"""Does the host keep a GPU fed in regular decoding over the services? The period of a regular
step against a stand-in GPU step of fixed length, on any machine.

The target service runs over a stand-in worker whose launched Verify calls queue like work on a
GPU: each finishes T after the later of its launch and the previous call's finish, and the host
is free meanwhile. The coordinator is the real Scheduler over the real session transport, two
regular steps in flight (coordinator/regular_pipeline.py), with the real tokenizer's text work
(the bundled pair's, or a tiny byte-level one). While the host keeps up, a step's period is T;
what it takes beyond T is time the GPU would idle. On an H200 at 64 sequences a regular step's
period is ~2.2 ms where the target's forward and sampling take ~1.5 (bench/results 2026-11-28
folded layers), so this asks how much of that gap the coordinator and the transport make.
`--profile` adds the coordinator process's top functions (cProfile) for the largest batch.

    .venv/bin/python bench/cpu/regular_period.py [--batches 8,64] [--t-ms 1.5] [--tokens 128]
        [--tokenizer MODEL_DIR] [--profile] [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "cpu"))

from rpc_overhead import WorkerProcess, _Runner, environment  # noqa: E402


class _Queued:
    """A launched call: done at `done_at` (perf_counter seconds)."""

    def __init__(self, done_at: float, response):
        self.done_at, self.response = done_at, response

    def ready(self) -> bool:
        return time.perf_counter() >= self.done_at

    def result(self):
        wait = self.done_at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return self.response

    def discard(self) -> None:
        pass


class QueuedTargetWorker:
    """Verify calls as a GPU runs queued steps: each takes t_s after the later of its launch and
    the previous call's end. Idle time (a launch that found the queue empty) is counted."""

    runner = _Runner()

    def __init__(self, t_s: float):
        self.t_s = t_s
        self.busy_until = 0.0
        self.idle_s = 0.0
        self.calls = 0

    def info(self):
        from bass.core.worker_api import WorkerInfo
        return WorkerInfo("queued", 151_936, 256, 4096, "bfloat16", "cpu")

    def start_verify(self, request):
        from bass.core.worker_api import Verdict, VerifyResponse
        now = time.perf_counter()
        if self.calls and now > self.busy_until:
            self.idle_s += now - self.busy_until
        self.calls += 1
        self.busy_until = max(now, self.busy_until) + self.t_s
        verdicts = [Verdict(accepted=len(i.draft_tokens), tokens=[*i.draft_tokens, 1_000 + i.seq_id % 500])
                    for i in request.items]
        return _Queued(self.busy_until, VerifyResponse(verdicts=verdicts, compute_s=self.t_s))

    def verify(self, request):
        return self.start_verify(request).result()

    def release(self, seq_ids):
        pass

    def reset(self):
        self.calls = 0


def serve(t_ms: float, address: str) -> None:
    from bass.target_service.servicer import SERVICE_NAME, TargetServicer
    from bass.transport.grpc_server import start_server, wait_for_stop_signal

    servicer = TargetServicer(QueuedTargetWorker(t_ms / 1000))
    running = start_server([servicer.register], [SERVICE_NAME], host=address, port=None)
    print(json.dumps({"address": address}), flush=True)
    wait_for_stop_signal()
    running.stop(0)


class QueuedWorkerProcess(WorkerProcess):
    def __init__(self, t_ms: float, address: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", "--t-ms", str(t_ms), "--address", address],
                                     stdout=subprocess.PIPE, text=True)
        self.address = json.loads(self.proc.stdout.readline())["address"]


def run_case(address: str, codec, batch: int, tokens: int, t_ms: float, rounds: int, profile: bool) -> dict:
    from bass.coordinator.scheduler import Scheduler
    from bass.core.config import DraftLengthConfig, SamplingParams, SchedulerConfig
    from bass.coordinator.requests import GenerationRequest
    from bass.transport.remote import RemoteTargetWorker

    target = RemoteTargetWorker(address, transport="session")
    prompt = "def fibonacci(n):\n    "
    periods, coordinator_ms, profiler = [], [], None
    for round_ in range(rounds + 1):  # round 0 warms the channel, the tokenizer and the allocator
        scheduler = Scheduler(target, None, codec, SchedulerConfig(max_batch_size=batch, max_n=1, max_new_tokens=tokens,
                                                                   draft_length=DraftLengthConfig.parse("0")))
        requests = [GenerationRequest(prompt=prompt, max_new_tokens=tokens, ignore_eos=True,
                                      sampling=SamplingParams(), seed=i) for i in range(batch)]
        if profile and round_ == rounds:
            profiler = cProfile.Profile()
            profiler.enable()
        started = time.perf_counter()
        scheduler.generate(requests)
        wall = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
        if round_:
            periods.append(1000 * wall / tokens)
            coordinator_ms.append(scheduler.step_stats.breakdown()["coordinator_ms"])
    target.close()
    entry = {"batch": batch, "t_ms": t_ms, "tokens": tokens, "period_ms_per_round": [round(p, 4) for p in periods],
             "period_ms_median": round(statistics.median(periods), 4),
             "beyond_t_ms": round(statistics.median(periods) - t_ms, 4),
             "coordinator_ms_median": round(statistics.median(coordinator_ms), 4)}
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        entry["profile_tottime_top25"] = text.getvalue().splitlines()
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("--t-ms", type=float, required=True)
    serve_p.add_argument("--address", required=True)
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--t-ms", type=float, default=1.5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokenizer", default=str(Path.home() / ".cache/bass/models/qwen2.5-coder-1.5b-instruct"),
                        help="a model directory whose tokenizer the coordinator uses (a tiny one if absent)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.t_ms, args.address)
        return
    from bass.coordinator.tokenizer import load_codec
    from tiny_models import save_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(args.tokenizer)
        if not (tokenizer_dir / "tokenizer.json").is_file():
            tokenizer_dir = Path(tmp) / "tokenizer"
            save_tokenizer(tokenizer_dir)
        codec = load_codec(tokenizer_dir)
        worker = QueuedWorkerProcess(args.t_ms, f"unix:{tmp}/worker.sock")
        try:
            batches = [int(b) for b in args.batches.split(",")]
            results = [run_case(worker.address, codec, b, args.tokens, args.t_ms, args.rounds,
                                args.profile and b == max(batches)) for b in batches]
        finally:
            worker.stop()
    report = {"environment": {**environment(), "cpus": os.cpu_count(), "tokenizer": str(tokenizer_dir.name)},
              "results": results}
    for r in results:
        print(f"batch {r['batch']}: period {r['period_ms_median']} ms against T = {r['t_ms']} "
              f"({r['beyond_t_ms']:+.3f}), coordinator {r['coordinator_ms_median']} ms a step, rounds "
              f"{r['period_ms_per_round']}")
    if args.profile:
        print("\n".join(results[-1]["profile_tottime_top25"][:40]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
