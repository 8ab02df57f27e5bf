"""What one Propose and one Verify cost inside the workers, host work included (issue #12).

Random weights at the real Qwen2.5-Coder shapes (cost does not depend on the values), CUDA
graphs captured as the workers capture them, a batch of sequences at a fixed context length.
Times DraftWorker.propose (k tokens per sequence, sampling included) and TargetWorker.verify
(k drafts + 1 per sequence, the target's tokens and the accept rule) with a host clock around
a synchronized call, median of repeats; the caches are rolled back after each call so every
repeat does the same work. Greedy and sampled (T 0.8, top-p 0.95).

It runs against the current build and against older ones (where Verify takes the draft's q),
so that a change and its baseline are measured in one session: `compare_speed.sh` style,
PYTHONPATH selects the build.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bass.app.bench.environment import describe
from bass.app.bench.steps import random_transformer, shape_config
from bass.core.config import RunnerConfig, SamplingParams
from bass.draft_service.worker import DraftWorker
from bass.engine.runner import ModelRunner
from bass.target_service.worker import TargetWorker
from bass.core.worker_api import AddSequence, ProposeItem, ProposeRequest, SequenceSampling, VerifyItem, VerifyRequest

MODES = {"greedy": SamplingParams(), "t0.8-p0.95": SamplingParams(temperature=0.8, top_p=0.95)}


def runner_for(shape: str, batch: int, context: int, max_draft: int, **model_options) -> ModelRunner:
    max_seq_len = context + max_draft + 16
    model = random_transformer(shape_config(shape), dtype="bfloat16", device="cuda", max_seq_len=max_seq_len,
                               attention="triton", **model_options)
    cfg = RunnerConfig(model_dir=Path("/nonexistent"), device="cuda", dtype="bfloat16", num_slots=batch,
                       max_seq_len=max_seq_len, attention="triton", graph_max_draft=max_draft)
    return ModelRunner(cfg, model=model)


def fill(runner: ModelRunner, batch: int, context: int) -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = runner.vocab_size
    for i in range(batch):
        runner.add([AddSequence(i + 1, tuple(torch.randint(0, vocab, (context,), generator=gen).tolist()))])


def snapshot(runner: ModelRunner, ids) -> dict:
    return {i: (len(runner.get(i).committed), runner.cache.length(runner.get(i).slot)) for i in ids}


def restore(runner: ModelRunner, saved: dict) -> None:
    for i, (committed, cached) in saved.items():
        state = runner.get(i)
        del state.committed[committed:]
        runner.cache.truncate(state.slot, min(cached, runner.cache.length(state.slot)))


def timed(call, repeats: int, warmup: int = 3) -> float:
    times = []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def profile(path: str, title: str, call_propose, call_verify) -> None:
    """Where a call's time goes: GPU kernels and host ops, 5 calls of each kind, appended to path."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from torch.profiler import record_function

    with open(path, "a") as out:
        for name, call in (("propose", call_propose), ("verify", call_verify)):
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    with record_function("call"):
                        call()
                torch.cuda.synchronize()
            out.write(f"== {title}: {name} (5 calls)\n")
            out.write(f"timeline (median us per call): {json.dumps(timeline(prof))}\n")
            out.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15) + "\n")


def timeline(prof) -> dict:
    """Where each profiled call's wall time goes, from the trace (medians over the calls, us):
    host work before its first GPU activity, GPU busy (the union of kernels and copies), GPU
    idle between its first and last activity (launch gaps inside graphs, host stalls), and host
    work after the last activity (reading results back, bookkeeping)."""
    from torch.autograd import DeviceType

    events = prof.events()
    calls = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name == "call" and e.device_type == DeviceType.CPU)
    gpu = sorted((e.time_range.start, e.time_range.end) for e in events
                 if e.device_type == DeviceType.CUDA and e.name != "call")
    rows = []
    for start, end in calls:
        mine = [(a, b) for a, b in gpu if start <= a < end]
        if not mine:
            continue
        busy, reach = 0.0, mine[0][0]
        for a, b in mine:
            if b > reach:
                busy += b - max(a, reach)
                reach = b
        first, last = mine[0][0], reach
        rows.append({"wall": end - start, "before_first": first - start, "gpu_busy": busy,
                     "gpu_idle_between": (last - first) - busy, "after_last": end - last})
    return {key: round(statistics.median(r[key] for r in rows), 1) for key in rows[0]} if rows else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="Give the draft an LM head over the first N token ids only (FR-Spec style; 0 = all).")
    ap.add_argument("--draft-int8", action="store_true",
                    help="The draft's projections and LM head in weight-only int8 (builds that have it).")
    ap.add_argument("--profile", help="Also write a torch profile of 5 calls of each kind (batch 8) to this file.")
    args = ap.parse_args()
    k, rows = args.k, []
    for batch in [int(b) for b in args.batches.split(",")]:
        target, draft = TargetWorker(runner_for("qwen2.5-coder-1.5b", batch, args.context, 8)), \
            DraftWorker(runner_for("qwen2.5-coder-0.5b", batch, args.context, 8,
                                   **({"int8_weights": True} if args.draft_int8 else {})))
        if args.draft_vocab:
            weights = draft.runner.model.weights
            weights.lm_head = weights.lm_head[:args.draft_vocab].contiguous()
        target.warm_up()
        draft.warm_up()
        fill(target.runner, batch, args.context)
        fill(draft.runner, batch, args.context)
        ids = list(range(1, batch + 1))
        for mode, params in MODES.items():
            sampling = [SequenceSampling(params, seed_key=1000 + i) for i in ids]
            propose = ProposeRequest(items=[ProposeItem(i, k, (), s) for i, s in zip(ids, sampling)])
            saved_draft = snapshot(draft.runner, ids)
            response = draft.propose(propose)
            restore(draft.runner, saved_draft)

            def call_propose():
                draft.propose(propose)
                restore(draft.runner, saved_draft)

            q = getattr(response, "q", None)  # older builds send the draft's q to Verify
            extra = {}
            if q is not None:
                extra = dict(q=q)
            items = [VerifyItem(i, tuple(t), s, **({"q_row_offset": o} if q is not None else {}))
                     for i, t, s, o in zip(ids, response.tokens, sampling, getattr(response, "q_row_offsets", ids))]
            verify = VerifyRequest(items=items, **extra)
            saved_target = snapshot(target.runner, ids)

            def call_verify():
                target.verify(verify)
                restore(target.runner, saved_target)

            regular = VerifyRequest(items=[VerifyItem(i, (), s) for i, s in zip(ids, sampling)])

            def call_regular():  # one regular decoding step: no drafts
                target.verify(regular)
                restore(target.runner, saved_target)

            propose_ms, verify_ms = timed(call_propose, args.repeats), timed(call_verify, args.repeats)
            regular_ms = timed(call_regular, args.repeats) if q is None else None
            if args.profile and batch == 8:
                profile(args.profile, f"{args.label} batch {batch} {mode}", call_propose, call_verify)
            row = {"build": args.label, "draft_int8": args.draft_int8, "draft_vocab": args.draft_vocab, "batch": batch, "k": k, "mode": mode, "context": args.context,
                   "propose_ms": round(propose_ms, 4), "propose_ms_per_draft_token": round(propose_ms / k, 4),
                   "verify_ms": round(verify_ms, 4),
                   "regular_step_ms": None if regular_ms is None else round(regular_ms, 4)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        del target, draft
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"benchmark": "worker-calls", "environment": describe("cuda"),
                                          "shapes": "qwen2.5-coder-1.5b target, 0.5b draft, random bf16 weights",
                                          "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
