#!/usr/bin/env python3
"""On the CPU: does it matter which threads run the draft's and the target's calls?

The co-located server (target_service/colocated.py) runs a whole speculative step, the draft's
proposal and the target's verification, on the target's session thread; separate servers run
them on two threads. Under the soak's load on 2 CPU cores the co-located server served ~25%
fewer requests, with the same work per step. This runs one in-process scheduler (tiny random
Llama pair, k = 3, 8 requests x 2 sequences x 64 tokens) three ways, interleaved: every worker
call on the calling thread, all on one helper thread, and the draft's and the target's on a
helper thread each; it prints seconds per round.

Usage: .venv/bin/python bench/cpu/cpu_worker_threads.py [--rounds 4] [--repeats 3]
(BASS_BENCH_THREADS=N with OMP_NUM_THREADS=N: torch's intra-op threads; default 2.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from bass.coordinator.requests import GenerationRequest  # noqa: E402
from conftest import build_scheduler  # noqa: E402
from tiny_models import make_model  # noqa: E402


class OnThread:
    """A worker whose every method call runs on one executor's thread."""

    def __init__(self, inner, pool: ThreadPoolExecutor):
        self.inner, self.pool = inner, pool

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        return lambda *a, **k: self.pool.submit(attr, *a, **k).result()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(int(__import__("os").environ.get("BASS_BENCH_THREADS", "2")))
    work = Path(tempfile.mkdtemp(prefix="bass-threads-"))
    target = make_model(work / "target", "llama", seed=1)
    draft = make_model(work / "draft", "llama", seed=2, perturb_from=target, perturb_scale=0.1)
    requests = [GenerationRequest(prompt_ids=(5 + i, 17, 33, 200), n=2, max_new_tokens=64, ignore_eos=True)
                for i in range(8)]
    for _ in range(args.repeats):
        for way in ("calling thread", "one helper thread", "a helper thread each"):
            s = build_scheduler(target, draft, "3", max_seq_len=512)
            s.speculative.fed_verify = s.speculative.chains = False  # the host path, whichever thread runs it
            one, two = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
            if way == "one helper thread":
                s.target, s.draft = OnThread(s.target, one), OnThread(s.draft, one)
            elif way == "a helper thread each":
                s.target, s.draft = OnThread(s.target, one), OnThread(s.draft, two)
            s.generate(requests[:2])
            seconds = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                s.generate(requests)
                seconds.append(round(time.perf_counter() - started, 3))
            print(f"{way:22s} {seconds}", flush=True)


if __name__ == "__main__":
    main()
