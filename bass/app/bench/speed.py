"""End-to-end decoding speed: `bass bench speed`.

Runs batches of HumanEval prompts (one sequence per prompt, every sequence generating exactly
max_new_tokens) through the coordinator's scheduler, either over in-process workers or over
the real draft and target gRPC services (one process for both by default, as `bass serve`
runs them; `colocate=False`: one each), for each draft-length policy
("0" is regular decoding), and reports ms per token per sequence, throughput, acceptance, a
per-step breakdown (draft, verify, RPC, coordinator), GPU utilization as BASS defines it
(achieved FLOP/s over peak) and peak GPU memory.
"""

from __future__ import annotations

import gc
import hashlib
import re
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

from bass.coordinator.requests import GenerationRequest
from bass.coordinator.scheduler import Scheduler
from bass.coordinator.step_stats import StepStats
from bass.coordinator.tokenizer import load_codec
from bass.core.config import (DraftLengthConfig, DraftStreamConfig, RunnerConfig, SamplingParams, SchedulerConfig,
                              ServeConfig, WorkerServiceConfig)
from bass.engine.weights import load_config
from bass.transport.grpc_server import freeze_startup_heap

MODES = {"greedy": SamplingParams(), "t0.8-p0.95": SamplingParams(temperature=0.8, top_p=0.95)}


def outputs_digest(results) -> str:
    """A short hash of every sequence's token ids: equal across policies when they decoded
    the same texts (always in fp32; up to bf16 near-ties on a GPU)."""
    ids = [s.token_ids for r in results for s in r.sequences]
    return hashlib.sha256(repr(ids).encode()).hexdigest()[:12]


def params_count(model_dir: Path) -> int:
    c = load_config(model_dir)
    per_layer = ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim * c.hidden_size + c.hidden_size * c.num_heads * c.head_dim
                 + 3 * c.hidden_size * c.intermediate_size)
    return c.num_layers * per_layer + c.vocab_size * c.hidden_size  # the LM head; embedding lookups are free


@contextmanager
def workers(target: RunnerConfig, draft: RunnerConfig, *, services: bool, draft_top_n: int,
            colocate: bool = True) -> Iterator[tuple]:
    """(target worker, draft worker): in-process objects, or gRPC clients of service processes.
    In-process with colocate=False, the target is here and the draft a service process of its own."""
    from bass.app.launcher import start_draft_worker, start_workers, stop_all
    from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker

    if not services and colocate:
        from bass.app.local import build_local_workers

        yield build_local_workers(target, draft, draft_top_n=draft_top_n)
        return

    def as_service(r: RunnerConfig, **extra) -> WorkerServiceConfig:
        return WorkerServiceConfig(model_dir=r.model_dir, device=r.device, dtype=r.dtype, num_slots=r.num_slots,
                                   max_seq_len=r.max_seq_len, attention=r.attention,
                                   batch_invariant=r.batch_invariant, int8_weights=r.int8_weights,
                                   few_row_cuda=r.few_row_cuda, lookup_tail=r.lookup_tail,
                                   programmatic_launch=r.programmatic_launch, **extra)

    config = ServeConfig(target=as_service(target), draft=as_service(draft, draft_top_n=draft_top_n),
                         colocate=colocate)
    procs: list = []
    try:
        if not services:
            from bass.app.local import build_local_workers

            draft_worker = RemoteDraftWorker(start_draft_worker(config.draft, procs))
            yield build_local_workers(target)[0], draft_worker
            return
        target_address, draft_address = start_workers(config, procs)
        d = RemoteDraftWorker(draft_address)
        yield RemoteTargetWorker(target_address, draft=d), d
    finally:
        stop_all(procs)


def measure(target: RunnerConfig, draft: RunnerConfig, prompts: list[str], *, batches: list[int], policies: list[str],
            mode: str, max_new_tokens: int, services: bool, draft_top_n: int = 64, peak_tflops: float | None = None,
            repeats: int = 3, progress=None, colocate: bool = True, trace: bool = False) -> list[dict]:
    """One row per (batch, policy): the run of median wall time out of `repeats` (walls of all runs kept).
    trace: the row's step_stats keep that run's per-step trace (StepStats.trace), its clock
    readings made relative to the run's start."""
    import torch

    codec = load_codec(target.model_dir)
    flops_per_token = {"target": 2 * params_count(target.model_dir), "draft": 2 * params_count(draft.model_dir)}
    rows = []
    with workers(target, draft, services=services, draft_top_n=draft_top_n, colocate=colocate) as (tw, dw):
        freeze_startup_heap()  # as every serving process does once it is up (bass/transport/grpc_server.py)
        for batch in batches:
            for policy in policies:
                scheduler = case_scheduler(tw, dw, codec, batch, policy, max_new_tokens)

                def run(tokens: int, round_: int):
                    return scheduler.generate(case_requests(prompts, batch, mode, tokens, round_))

                # Warm-up, untimed: CUDA graphs, the allocator, the first cost measurements. `auto`
                # learns per batch-size bucket, and a round's tail (its last sequences finishing one
                # by one) reaches buckets that a short warm-up does not: their first timings fell
                # inside timed rounds (H200, T = 0.8, 4 sequences: 7 regular steps, 10% of the
                # reported round; bench/results/journal/2026-11-28-h200-auto-and-layer-paths.md).
                run(max_new_tokens if policy == "auto" else min(16, max_new_tokens), 0)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                runs = []
                for round_ in range(1, repeats + 1):
                    scheduler.step_stats = StepStats(trace=[] if trace else None)  # count the measured run only
                    pauses = _GcPauses() if trace else None
                    t0 = time.perf_counter()
                    with pauses or nullcontext():
                        results = run(max_new_tokens, round_)
                    runs.append((time.perf_counter() - t0, scheduler.step_stats, results,
                                 pauses.relative_to(t0) if trace else None))
                    if trace:
                        scheduler.step_stats.trace = [_traced(entry, t0) for entry in scheduler.step_stats.trace]
                digests = [outputs_digest(r[2]) for r in runs]  # in round order, before the sort
                walls_by_round = [round(r[0], 3) for r in runs]  # beside the digests: which text ran how fast
                runs.sort(key=lambda r: r[0])
                wall, st, results, gc_pauses = runs[len(runs) // 2]
                generated = sum(len(s.token_ids) for r in results for s in r.sequences)
                flops = (flops_per_token["target"] * st.verify_tokens
                         + flops_per_token["draft"] * (st.draft_tokens + st.sequence_steps * bool(st.draft_forwards)))
                row = {"batch": batch, "policy": policy, "mode": mode, "services": services,
                       "colocated": services and colocate, "draft_process": "target's" if colocate else "own",
                       "max_new_tokens": max_new_tokens, "generated_tokens": generated, "wall_s": round(wall, 3),
                       "wall_s_all_runs": [round(r[0], 3) for r in runs], "wall_s_per_round": walls_by_round,
                       "outputs_digest_per_round": digests,
                       "ms_per_token_per_sequence": round(1000 * wall / max_new_tokens, 4),
                       # Each sampled round draws its own text, so the median round can be another
                       # text's in each row (H100, T = 0.8: one round of fixed k = 3 took 0.24 s
                       # and another 0.55): compare sampled rows by the mean over rounds.
                       "ms_per_token_per_sequence_mean": round(
                           1000 * statistics.fmean(r[0] for r in runs) / max_new_tokens, 4),
                       "tokens_per_s": round(generated / wall, 1),
                       # Of the draft's tokens: lookup tokens the target took (a tail after the
                       # drafts, a streamed step's stand-ins) are not the draft's.
                       "acceptance_rate": round((st.committed_tokens - st.sequence_steps - st.lookup_tail_kept
                                                 - st.stream_lookup_kept) / st.draft_tokens, 4)
                       if st.draft_tokens else None,
                       "tokens_per_sequence_step": round(st.committed_tokens / max(st.sequence_steps, 1), 3),
                       "steps": st.steps, "step_stats": st.to_dict(),
                       "achieved_tflops": round(flops / wall / 1e12, 3)}
                if gc_pauses is not None:
                    row["gc_pauses"] = gc_pauses
                if hasattr(scheduler.policy, "describe"):
                    row["policy_state"] = scheduler.policy.describe()  # after every run (auto)
                if peak_tflops:
                    row["gpu_utilization"] = round(flops / wall / 1e12 / peak_tflops, 4)
                if torch.cuda.is_available() and not services:
                    row["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                rows.append(row)
                scheduler.close()
                if progress:
                    progress(f"batch {batch} policy {policy}: {row['ms_per_token_per_sequence']} ms/token/seq, "
                             f"{row['tokens_per_sequence_step']} tokens/step")
    return rows


# streamK[cC][wW][lL][nN]: streamed speculation verifying up to K drafts a sequence, the draft's
# loop drafting C tokens a call up to L ahead, a step waiting up to W ms for a sequence with no
# draft, positions without a draft filled by lookups of up to N tokens (n0: off).
_STREAM_POLICY = re.compile(r"stream(\d+)(?:c(\d+))?(?:w(\d+(?:\.\d+)?))?(?:l(\d+))?(?:n(\d+))?")


def stream_config(policy: str) -> DraftStreamConfig:
    """The DraftStreamConfig of a policy `streamK[cC][wW][lL][nN]` (off for any other policy)."""
    m = _STREAM_POLICY.fullmatch(policy)
    if m is None:
        return DraftStreamConfig()
    block, chunk, wait, lookahead, lookup = m.groups()
    defaults = DraftStreamConfig()
    return DraftStreamConfig(block=int(block), chunk=int(chunk or defaults.chunk),
                             wait_ms=float(wait or defaults.wait_ms), lookahead=int(lookahead or defaults.lookahead),
                             lookup=defaults.lookup if lookup is None else int(lookup))


def case_scheduler(target, draft, codec, batch: int, policy: str, max_new_tokens: int) -> Scheduler:
    """The scheduler of one (batch, policy) case: fresh, so its policy learns from nothing;
    without the draft for regular decoding; one sequence a request. A policy `streamK...` is
    streamed speculation (`stream_config`)."""
    stream = stream_config(policy)
    length = DraftLengthConfig.parse("0" if stream.on else policy)
    return Scheduler(target, draft if length.speculates or stream.on else None, codec,
                     SchedulerConfig(max_batch_size=batch, max_n=1, max_new_tokens=max_new_tokens, draft_length=length,
                                     draft_stream=stream))


def case_requests(prompts: list[str], batch: int, mode: str, tokens: int, round_: int) -> list[GenerationRequest]:
    """One round's requests of a case: `batch` prompts (cycled), seeded alike for every policy,
    so that each decodes the same texts (up to bf16 numerics) and policies are compared on equal
    acceptance, not on luck."""
    return [GenerationRequest(prompt=prompts[i % len(prompts)], max_new_tokens=tokens, ignore_eos=True,
                              sampling=MODES[mode], seed=1000 * round_ + i) for i in range(batch)]


def _traced(entry: tuple, t0: float) -> list:
    """A StepStats.trace entry for the JSON: seconds as milliseconds, each sequence's tokens as
    [seq_id, tokens] pairs, the commit's clock from the run's start."""
    k, sequences, tokens, draft_s, timed_s, per_sequence, at = entry
    return [k, sequences, tokens, round(1000 * draft_s, 3), None if timed_s is None else round(1000 * timed_s, 3),
            [list(pair) for pair in per_sequence], round(1000 * (at - t0), 3)]


class _GcPauses:
    """The coordinator process's garbage collections during a run: (generation, start, ms)
    each, to tell a collection's pause from the workers' time in a step trace."""

    def __init__(self):
        self.pauses: list[tuple[int, float, float]] = []
        self._started: float | None = None

    def __enter__(self):
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        elif self._started is not None:
            self.pauses.append((info["generation"], self._started, now - self._started))
            self._started = None

    def relative_to(self, t0: float) -> list[list]:
        """[generation, ms from t0 at its start, ms it took] per collection."""
        return [[g, round(1000 * (at - t0), 3), round(1000 * took, 3)] for g, at, took in self.pauses]
