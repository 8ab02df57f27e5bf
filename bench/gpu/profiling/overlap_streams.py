"""How much of the draft's time one GPU can hide behind the target's: the draft's k forwards and
the target's verification of k + 1 tokens a sequence, timed alone, back to back on one stream,
and at the same time on two streams. No models needed: random weights at the real shapes (the
1.5B target in bf16, the 0.5B draft with its default int8 projections), both as CUDA graphs, as
the workers run them.

Why: a speculative step today is sequential on the GPU (the draft's forwards, then the
verification queued behind them), and each of its kernels reads few bytes for its launch and
ramp (our forwards run at 15-40% of the bandwidth floor), so two models' kernels side by side
may share the GPU almost for free. If they do, drafting step t + 1 while step t verifies (issue
#36's pipeline, on one GPU as on two) takes most of the draft off the critical path.

Also answers whether verifying k + 1 rows really costs twice a regular step (issue #35): the
target's forward at q = 1 and q = k + 1 is timed with the same events.

    PYTHONPATH=/tmp/site python3 bench/gpu/profiling/overlap_streams.py OUT.json [BATCHES] [K]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from bass.app.bench.steps import StepTimer, random_transformer, shape_config

CONTEXT = 512
REPEATS = 30


def median_ms(run, repeats: int = REPEATS, warmup: int = 3) -> float:
    """Median of `run()` timed with events on the current stream (run may use other streams, as
    long as it makes the current stream wait for them)."""
    times = []
    for i in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


class Forwards:
    """Forwards of one model over a filled batch, each rolled back afterwards."""

    def __init__(self, timer: StepTimer):
        self.runner, self.states = timer.runner, timer.states
        self.lengths = [self.runner.cache.length(s.slot) for s in self.states]

    def run(self, q: int, times: int = 1) -> None:
        """`times` forwards of q tokens a sequence (each one's logits argmaxed, as a step does)."""
        for _ in range(times):
            # The first forward also runs each sequence's pending token; later ones only drafts.
            work = [(s, [7] * (q - max(0, self.runner.pending(s)))) for s in self.states]
            self.runner.forward(work, [q] * len(self.states)).argmax(-1)

    def rollback(self) -> None:
        for s, n in zip(self.states, self.lengths):
            self.runner.cache.truncate(s.slot, n)


@torch.inference_mode()
def main() -> None:
    out = Path(sys.argv[1])
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,8,16,32,64").split(",")]
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    props = torch.cuda.get_device_properties(0)
    target_model = random_transformer(shape_config("qwen2.5-coder-1.5b"), dtype="bfloat16", device="cuda",
                                      max_seq_len=CONTEXT + 64, attention="triton")
    draft_model = random_transformer(shape_config("qwen2.5-coder-0.5b"), dtype="bfloat16", device="cuda",
                                     max_seq_len=CONTEXT + 64, attention="triton", int8_weights=True)
    rows = []
    for batch in batches:
        target = Forwards(StepTimer(target_model, batch=batch, context=CONTEXT, max_q=k + 1, attention="triton",
                                    cuda_graphs=True, device="cuda"))
        draft = Forwards(StepTimer(draft_model, batch=batch, context=CONTEXT, max_q=k + 1, attention="triton",
                                   cuda_graphs=True, device="cuda"))
        side_a, side_b = torch.cuda.Stream(), torch.cuda.Stream()

        def alone(fn):
            def run():
                fn()
                target.rollback()
                draft.rollback()
            return run

        def sequential():
            draft.run(1, k)
            target.run(k + 1)
            target.rollback()
            draft.rollback()

        def concurrent():
            here = torch.cuda.current_stream()
            side_a.wait_stream(here)
            side_b.wait_stream(here)
            with torch.cuda.stream(side_b):  # the verification first: it is the longer one
                target.run(k + 1)
            with torch.cuda.stream(side_a):
                draft.run(1, k)
            here.wait_stream(side_a)
            here.wait_stream(side_b)
            target.rollback()
            draft.rollback()

        row = {"batch": batch, "k": k, "context": CONTEXT,
               "target_q1_ms": median_ms(alone(lambda: target.run(1))),
               "target_verify_ms": median_ms(alone(lambda: target.run(k + 1))),
               "draft_q1_ms": median_ms(alone(lambda: draft.run(1))),
               "draft_k_ms": median_ms(alone(lambda: draft.run(1, k))),
               "sequential_ms": median_ms(sequential),
               "concurrent_ms": median_ms(concurrent)}
        # Twice more in the other order, so drift shows.
        row["sequential_again_ms"] = median_ms(sequential)
        row["concurrent_again_ms"] = median_ms(concurrent)
        seq = min(row["sequential_ms"], row["sequential_again_ms"])
        conc = min(row["concurrent_ms"], row["concurrent_again_ms"])
        row["hidden_share_of_draft"] = round((seq - conc) / row["draft_k_ms"], 3)
        row["verify_over_regular"] = round(row["target_verify_ms"] / row["target_q1_ms"], 3)
        rows.append({key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()})
        print(f"batch {batch:3d} k={k}: target q1 {row['target_q1_ms']:.3f} verify {row['target_verify_ms']:.3f} "
              f"({row['verify_over_regular']:.2f}x) | draft 1 {row['draft_q1_ms']:.3f} k {row['draft_k_ms']:.3f} | "
              f"sequential {seq:.3f} concurrent {conc:.3f} -> {row['hidden_share_of_draft']:.0%} of the draft hidden",
              flush=True)
        del target, draft
        torch.cuda.empty_cache()
    out.write_text(json.dumps({"device": props.name, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
