"""Does the host keep a GPU fed in speculative decoding over a co-located pair? The period of a
speculative step against stand-in GPU work of fixed length, with steps sent ahead
(coordinator/speculative_ahead.py) and without, on any machine.

The target service runs the real `Speculation` (target_service/colocated.py) and the real
session transport over stand-in draft and target workers whose launches queue like work on one
GPU: each finishes its length after the later of its launch and the previous one's end, and the
host is free meanwhile. A draft forward takes `--draft-ms`, a verification `--verify-ms`; each
Speculate call also holds the worker's handler thread for `--host-ms` (the real worker's
staging, launches and commit: ~1 ms on an H200 host at one sequence). Every draft is accepted.
The coordinator is the real Scheduler at a fixed draft length. While the host keeps up, a step's
period is its GPU work (k draft forwards and a verification); what it takes beyond that is time
the GPU would idle. On an H200 at one sequence a k = 2 step took 3.31-3.45 ms without steps sent
ahead against ~2.8 of GPU work, 2.95 with them (bench/results/2026-11-28-h200x2-speculate-ahead/).

    .venv/bin/python bench/cpu/speculative_period.py [--batches 1,8] [--lengths 2,3,4]
        [--draft-ms 0.65] [--verify-ms 1.6] [--host-ms 1.0] [--tokens 128] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "cpu"))

from rpc_overhead import WorkerProcess, _Runner, environment  # noqa: E402


class Gpu:
    """One stream: each launch ends its length after the later of now and the last launch's end."""

    def __init__(self):
        self.busy_until = 0.0
        self.idle_s = 0.0
        self.launches = 0

    def launch(self, seconds: float) -> float:
        now = time.perf_counter()
        if self.launches and now > self.busy_until:
            self.idle_s += now - self.busy_until
        self.launches += 1
        self.busy_until = max(now, self.busy_until) + seconds
        return self.busy_until


def wait_until(when: float) -> None:
    wait = when - time.perf_counter()
    if wait > 0:
        time.sleep(wait)


def spin(seconds: float) -> None:
    """Host work: the handler thread busy (and holding the GIL) for this long."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Proposal:
    """Its tokens "on the device": a CPU tensor, which Speculation reads the shape of."""

    def __init__(self, tokens: list[list[int]], done_at: float, gpu_s: float):
        import torch
        self.on_device, self.done_at, self.gpu_s = torch.tensor(tokens), done_at, gpu_s

    def result(self):
        from bass.core.worker_api import ProposeResponse
        wait_until(self.done_at)
        return ProposeResponse(tokens=self.on_device.tolist(), compute_s=self.gpu_s)


class _Chain:
    def __init__(self, seq_ids: list[int], k: int, done_at: float, gpu_s: float):
        self.seq_ids, self.k, self.done_at, self.gpu_s = seq_ids, k, done_at, gpu_s
        self.queued = True

    def reconcile(self, emitted, revised=()):
        pass

    def select(self, seq_ids):
        return _Proposal([[7] * self.k for _ in seq_ids], self.done_at, self.gpu_s)


class _Pending:
    tail = 0
    revised: list[int] = []

    def __init__(self, response, done_at: float):
        self.response, self.done_at = response, done_at
        self.verdicts_on_device = self

    def result(self):
        wait_until(self.done_at)
        return self.response


class _StandInWorker:
    """What both stand-ins answer alike: their info, and releases and resets that hold nothing."""

    runner = _Runner()
    name = "stand-in"

    def info(self):
        from bass.core.worker_api import WorkerInfo
        return WorkerInfo(self.name, 151_936, 256, 4096, "bfloat16", "cpu")

    def release(self, seq_ids):
        pass

    def reset(self):
        pass


class StandInDraft(_StandInWorker):
    name = "stand-in draft"

    def __init__(self, gpu: Gpu, forward_s: float):
        self.gpu, self.forward_s = gpu, forward_s

    def chains(self, num_seqs, k, verified_k, sampled, tail=0) -> bool:
        return k >= 1

    def start_propose(self, request):
        k = max(item.num_tokens for item in request.items)
        return _Proposal([[7] * item.num_tokens for item in request.items], self.gpu.launch(k * self.forward_s),
                         k * self.forward_s)

    def start_chained(self, request, verdicts, verified_k, tail=0):
        k = request.items[0].num_tokens
        return _Chain([item.seq_id for item in request.items], k, self.gpu.launch(k * self.forward_s),
                      k * self.forward_s)

    def propose(self, request):
        return self.start_propose(request).result()


class StandInTarget(_StandInWorker):
    name = "stand-in target"

    def __init__(self, gpu: Gpu, verify_s: float, host_s: float):
        self.gpu, self.verify_s, self.host_s = gpu, verify_s, host_s

    def start_verify(self, request, drafts=None):
        from bass.core.worker_api import Verdict, VerifyResponse
        spin(self.host_s)  # the worker's staging, launches and (later) commit, on the handler thread
        rows = drafts.tolist() if drafts is not None else [list(item.draft_tokens) for item in request.items]
        verdicts = [Verdict(accepted=len(d), tokens=[*d, 1_000 + item.seq_id % 500])
                    for item, d in zip(request.items, rows)]
        return _Pending(VerifyResponse(verdicts=verdicts, compute_s=self.verify_s), self.gpu.launch(self.verify_s))

    def verify(self, request):
        return self.start_verify(request).result()


def serve(draft_ms: float, verify_ms: float, host_ms: float, address: str) -> None:
    from bass.draft_service.servicer import SERVICE_NAME as DRAFT_SERVICE, DraftServicer
    from bass.target_service.colocated import ColocatedDraft, Speculation
    from bass.target_service.servicer import SERVICE_NAME as TARGET_SERVICE, TargetServicer
    from bass.transport.grpc_server import start_server, wait_for_stop_signal

    gpu = Gpu()
    draft, target = StandInDraft(gpu, draft_ms / 1000), StandInTarget(gpu, verify_ms / 1000, host_ms / 1000)
    speculation = Speculation(draft, target)
    lock, instance_id = threading.Lock(), uuid.uuid4().hex
    servicers = [TargetServicer(target, lock=lock, instance_id=instance_id, speculation=speculation),
                 DraftServicer(ColocatedDraft(draft, speculation), lock=lock, instance_id=instance_id)]
    running = start_server([s.register for s in servicers], [TARGET_SERVICE, DRAFT_SERVICE], host=address, port=None)
    print(json.dumps({"address": address}), flush=True)
    wait_for_stop_signal()
    running.stop(0)


class StandInPairProcess(WorkerProcess):
    def __init__(self, draft_ms: float, verify_ms: float, host_ms: float, address: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", "--draft-ms", str(draft_ms), "--verify-ms",
                                      str(verify_ms), "--host-ms", str(host_ms), "--address", address],
                                     stdout=subprocess.PIPE, text=True)
        self.address = json.loads(self.proc.stdout.readline())["address"]


def run_case(address: str, codec, batch: int, k: int, ahead: bool, tokens: int, rounds: int) -> dict:
    from bass.coordinator import speculative_ahead
    from bass.coordinator.requests import GenerationRequest
    from bass.coordinator.scheduler import Scheduler
    from bass.core.config import DraftLengthConfig, SamplingParams, SchedulerConfig
    from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker

    plan_ahead = speculative_ahead.plan_ahead
    if not ahead:
        speculative_ahead.plan_ahead = lambda *args: None
    draft = RemoteDraftWorker(address)
    target = RemoteTargetWorker(address, draft=draft)
    periods, sent_ahead = [], []
    try:
        for round_ in range(rounds + 1):  # round 0 warms the channels, the tokenizer and the allocator
            scheduler = Scheduler(target, draft, codec, SchedulerConfig(
                max_batch_size=batch, max_n=1, max_new_tokens=tokens, draft_length=DraftLengthConfig.parse(str(k))))
            assert target.verifies_device_drafts, "the proxies found one process behind both services"
            requests = [GenerationRequest(prompt="def fibonacci(n):\n    ", max_new_tokens=tokens, ignore_eos=True,
                                          sampling=SamplingParams(), seed=i) for i in range(batch)]
            started = time.perf_counter()
            scheduler.generate(requests)
            wall = time.perf_counter() - started
            st = scheduler.step_stats
            if round_:
                periods.append(1000 * wall / st.steps)
                sent_ahead.append(st.sent_ahead_steps / st.steps)
    finally:
        speculative_ahead.plan_ahead = plan_ahead
        target.close()
        draft.close()
    return {"batch": batch, "k": k, "sent_ahead": ahead, "period_ms_per_round": [round(p, 4) for p in periods],
            "period_ms_median": round(statistics.median(periods), 4),
            "share_of_steps_sent_ahead": round(statistics.median(sent_ahead), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    serve_p = sub.add_parser("serve")
    for p in (parser, serve_p):
        p.add_argument("--draft-ms", type=float, default=0.65)
        p.add_argument("--verify-ms", type=float, default=1.6)
        p.add_argument("--host-ms", type=float, default=1.0)
    serve_p.add_argument("--address", required=True)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--lengths", default="2,3,4")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.draft_ms, args.verify_ms, args.host_ms, args.address)
        return
    from bass.coordinator.tokenizer import load_codec
    from tiny_models import save_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp) / "tokenizer"
        save_tokenizer(tokenizer_dir)
        codec = load_codec(tokenizer_dir)
        pair = StandInPairProcess(args.draft_ms, args.verify_ms, args.host_ms, f"unix:{tmp}/pair.sock")
        try:
            results = [run_case(pair.address, codec, b, k, ahead, args.tokens, args.rounds)
                       for b in (int(x) for x in args.batches.split(","))
                       for k in (int(x) for x in args.lengths.split(","))
                       for ahead in (False, True)]
        finally:
            pair.stop()
    for r in results:
        r["gpu_ms"] = round(r["k"] * args.draft_ms + args.verify_ms, 4)
        r["beyond_gpu_ms"] = round(r["period_ms_median"] - r["gpu_ms"], 4)
    report = {"environment": {**environment(), "cpus": os.cpu_count()},
              "stand_in": {"draft_ms": args.draft_ms, "verify_ms": args.verify_ms, "host_ms": args.host_ms},
              "results": results}
    for r in results:
        print(f"batch {r['batch']} k {r['k']} {'sent ahead' if r['sent_ahead'] else 'one at a time'}: "
              f"period {r['period_ms_median']} ms against {r['gpu_ms']} of GPU work ({r['beyond_gpu_ms']:+.3f}); "
              f"{r['share_of_steps_sent_ahead']:.0%} of steps sent ahead; rounds {r['period_ms_per_round']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
