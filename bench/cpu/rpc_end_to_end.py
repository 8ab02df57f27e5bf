"""Decoding through the worker services, unary calls against the Session stream, next to in-process.

Tiny random Llama models (tests/tiny_models.py, sized so that a step takes milliseconds on a
CPU), the real draft and target services as separate processes (as `bass bench speed
--services` starts them), and the coordinator's Scheduler over RemoteTargetWorker /
RemoteDraftWorker with each transport, against the same service processes, interleaved, so
the two transports meet the same machine state. Greedy, one sequence per prompt, every
sequence generating exactly --max-new-tokens; reports ms per step and the per-step breakdown.

    .venv/bin/python bench/cpu/rpc_end_to_end.py [--batches 1,8] [--policies 0,4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "cpu"))


def run(scheduler, batch: int, tokens: int):
    from bass.coordinator.requests import GenerationRequest
    from bass.coordinator.step_stats import StepStats
    prompts = [(5 + i, 17, 33, 200, 7, 9) for i in range(batch)]
    scheduler.step_stats = StepStats()
    t0 = time.perf_counter()
    results = scheduler.generate([GenerationRequest(prompt_ids=p, max_new_tokens=tokens, ignore_eos=True)
                                  for p in prompts])
    wall = time.perf_counter() - t0
    return wall, scheduler.step_stats, [r.sequences[0].token_ids for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--policies", default="0,4")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from tiny_models import make_model
    from rpc_overhead import environment

    from bass.app.bench.speed import workers
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig
    from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker
    from bass.coordinator.scheduler import Scheduler
    from bass.coordinator.tokenizer import load_codec
    from bass.app.local import build_local_workers

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        target_dir = make_model(Path(tmp) / "target", "llama", seed=1, hidden=args.hidden, layers=args.layers)
        draft_dir = make_model(Path(tmp) / "draft", "llama", seed=2, hidden=args.hidden // 2, layers=args.layers // 2,
                               heads=4, kv_heads=2)
        runner = {d: RunnerConfig(model_dir=d, device="cpu", num_slots=64, max_seq_len=256, attention="pad")
                  for d in (target_dir, draft_dir)}
        codec = load_codec(target_dir)
        local = build_local_workers(runner[target_dir], runner[draft_dir], draft_top_n=64)
        with workers(runner[target_dir], runner[draft_dir], services=True, draft_top_n=64) as (t_remote, d_remote):
            pairs = {"in-process": local}
            for transport in ("unary", "session"):
                pairs[transport] = (RemoteTargetWorker(t_remote.address, transport=transport),
                                    RemoteDraftWorker(d_remote.address, transport=transport))
            for batch in map(int, args.batches.split(",")):
                for policy in args.policies.split(","):
                    length = DraftLengthConfig.parse(policy)
                    config = SchedulerConfig(max_batch_size=batch, max_n=1, max_new_tokens=args.max_new_tokens,
                                             draft_length=length)
                    schedulers = {name: Scheduler(t, d if length.speculates else None, codec, config)
                                  for name, (t, d) in pairs.items()}
                    walls: dict = {name: [] for name in schedulers}
                    stats, outputs = {}, {}
                    for name, s in schedulers.items():
                        run(s, batch, 8)  # warm-up
                    for _ in range(args.repeats):
                        for name, s in schedulers.items():  # interleaved: each transport meets the same load
                            wall, st, out = run(s, batch, args.max_new_tokens)
                            walls[name].append(wall)
                            stats[name], outputs[name] = st, out
                    assert all(o == outputs["in-process"] for o in outputs.values()), "greedy output differs"
                    for name in schedulers:
                        st = stats[name]
                        wall = statistics.median(walls[name])
                        row = {"batch": batch, "policy": policy, "path": name, "wall_s": round(wall, 4),
                               "wall_s_all_runs": [round(w, 4) for w in walls[name]],
                               "ms_per_step": round(1000 * wall / max(st.steps, 1), 3), "steps": st.steps,
                               "breakdown_ms_per_step": st.to_dict().get("breakdown_ms_per_step")}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            for name in ("unary", "session"):
                for w in pairs[name]:
                    w.close()
    if args.out:
        args.out.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
