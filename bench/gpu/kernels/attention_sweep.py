#!/usr/bin/env python3
"""Time the ragged attention kernels (triton vs pad vs split) on one CUDA GPU.

One layer's attention for Qwen2.5 shapes (default 1.5B: 12 query heads, 2 kv heads, head_dim 128;
--model 0.5b: 14 / 2 / 64) in bf16, over a grid of
  batch sizes        1, 8, 32, 64
  query lengths      1 (decode), 5, 9, 33 (verify k+1 for k = 4, 8, 32)
  context spreads    equal (every context 512) and mixed (uniform 64..2048, seeded)
Each (config, kernel) is checked against `split` once, warmed up, then timed --repeats times
(>= 20) with CUDA events; the median (and p10 / p90) is reported. Per kernel:
  graph_ms  one call captured in a CUDA graph and replayed: the GPU time alone
  eager_ms  one plain call between events: GPU time or the host's launch cost, whichever is longer
  host_us   host time per call, 100 calls issued back to back (the Python + launch overhead)
--host-profile splits attend_triton's host time (bare Triton launch, planning, allocation);
--triton-variant times attend_triton with forced launch parameters next to the heuristics' pick.
By default the L2 cache is flushed before every timed repeat (in a serving step the other
layers evict this layer's KV); --no-flush keeps it warm.

Usage (the repository installed, e.g. `pip install -e .`):
  python bench/gpu/kernels/attention_sweep.py --out bench/results/attention_sweep_h100.json
Prints a table and writes JSON with the device name and torch / triton versions.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

try:
    from bass.kernels.batch import RaggedBatch, SequenceChunk
    from bass.kernels.attention import attend_pad, attend_split
except ImportError:  # run from a checkout that is not installed: map the folders by hand
    import importlib.util
    import types

    root = Path(__file__).resolve().parents[3]
    pkg = types.ModuleType("bass")
    pkg.__path__ = [str(root / "bass")]
    sys.modules["bass"] = pkg
    for sub in ("engine", "kernels"):
        spec = importlib.util.spec_from_file_location(
            f"bass.{sub}", root / sub / "__init__.py", submodule_search_locations=[str(root / sub)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"bass.{sub}"] = mod
        spec.loader.exec_module(mod)
    from bass.kernels.batch import RaggedBatch, SequenceChunk
    from bass.kernels.attention import attend_pad, attend_split

MODELS = {
    # name: (query heads, kv heads, head_dim)
    "1.5b": (12, 2, 128),
    "0.5b": (14, 2, 64),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def make_case(batch_size: int, q_len: int, spread: str, heads: int, kv_heads: int, head_dim: int,
              dtype: torch.dtype, seed: int):
    rng = random.Random(seed)
    if spread == "equal":
        ctxs = [512] * batch_size
    elif spread == "mixed":
        ctxs = [rng.randint(64, 2048) for _ in range(batch_size)]
    else:
        raise ValueError(spread)
    ctxs = [max(c, q_len) for c in ctxs]
    max_len = max(ctxs)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # Slots in a shuffled order so that sequence b does not simply read slot b.
    slots = list(range(batch_size))
    rng.shuffle(slots)
    k_cache = torch.randn(batch_size, max_len, kv_heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    v_cache = torch.randn(batch_size, max_len, kv_heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    chunks = [SequenceChunk(slot=s, start=c - q_len, tokens=[0] * q_len, logit_rows=0) for s, c in zip(slots, ctxs)]
    batch = RaggedBatch.build(chunks, "cuda")
    q = torch.randn(batch.num_tokens, heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    return q, k_cache, v_cache, batch, ctxs


class L2Flush:
    def __init__(self, enabled: bool):
        size = 2 * torch.cuda.get_device_properties(0).L2_cache_size if enabled else 0
        self.buf = torch.empty(max(size, 1) // 4, dtype=torch.int32, device="cuda") if enabled else None

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def time_eager(fn, flush: L2Flush, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_graph(fn, flush: L2Flush, warmup: int, repeats: int) -> list[float]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (and compile) off the capture
        for _ in range(max(warmup, 2)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_host(fn, calls: int = 100) -> float:
    """Microseconds of host time per call, calls issued back to back (launch overhead when the
    GPU work is shorter than the host's)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def host_profile(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Where attend_triton's host time goes, for a batch-64 decode step (microseconds per call)."""
    from bass.kernels import triton_attention as ta

    q, k_cache, v_cache, batch, _ = make_case(64, 1, "equal", heads, kv_heads, head_dim, dtype, 0)
    scale = head_dim ** -0.5
    out = torch.empty_like(q)
    group = heads // kv_heads
    plan = ta.plan_launch(batch.q_lens_list, batch.ctx_lens_list, group, kv_heads, head_dim,
                          torch.cuda.get_device_properties(0).multi_processor_count, num_splits=1)
    grid = (-(-batch.max_q * group // plan.block_m), batch.num_seqs, kv_heads)
    launch_args = (q, k_cache, v_cache, out, out, out, batch.slots,
                   batch.slots, batch.q_starts, batch.q_lens, batch.ctx_lens,
                   scale * ta._LOG2E, plan.split_size, *q.stride(), *k_cache.stride(), *v_cache.stride(),
                   0, *out.stride(), 0, 0, 0)
    meta = dict(NUM_KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim,
                BLOCK_D=max(16, 1 << (head_dim - 1).bit_length()), BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32", UPCAST=False, SPLIT=False,
                MASK_EVERY_TILE=False, num_warps=plan.num_warps, num_stages=plan.num_stages)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    parts = {
        "attend_triton": lambda: ta.attend_triton(q, k_cache, v_cache, batch, scale),
        "split8_triton": lambda: ta.attend_triton(q, k_cache, v_cache, batch, scale, num_splits=8),
        "bare_launch": lambda: ta._ragged_attn_fwd[grid](*launch_args, **meta),
        "plan_launch": lambda: ta.plan_launch(batch.q_lens_list, batch.ctx_lens_list, group, kv_heads,
                                              head_dim, sms),
        "torch_empty": lambda: torch.empty((q.shape[0], heads, head_dim), dtype=dtype, device="cuda"),
    }
    res = {name: time_host(fn, 300) for name, fn in parts.items()}
    for name, us in res.items():
        print(f"# host {name:>14}: {us:7.1f} us/call")
    return res


def summarize(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "p10_ms": percentile(times, 0.1),
            "p90_ms": percentile(times, 0.9), "n": len(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--q-lens", type=int, nargs="+", default=[1, 5, 9, 33])
    ap.add_argument("--spreads", nargs="+", choices=["equal", "mixed"], default=["equal", "mixed"])
    ap.add_argument("--kernels", nargs="+", default=["triton", "pad", "split"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-flush", action="store_true", help="keep the L2 cache warm between repeats")
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bounds", type=int, default=0, metavar="MAX_SEQ_LEN",
                    help="run the kernels on batches as a CUDA graph sees them: lengths known on the host only "
                         "as this bound, each sequence's splits sized on the device")
    ap.add_argument("--host-profile", action="store_true",
                    help="also break down attend_triton's host (launch) time for a batch-64 decode step")
    ap.add_argument("--triton-variant", action="append", default=[], metavar="NAME=KEY:VAL,...",
                    help="also time attend_triton with launch overrides, e.g. s4=num_splits:4,block_n:32 "
                         "(keys: num_splits, block_m, block_n, num_warps, num_stages); repeatable")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_sweep needs a CUDA device", file=sys.stderr)
        return 2
    if args.repeats < 20:
        ap.error("--repeats must be >= 20")

    kernels = {"pad": attend_pad, "split": attend_split}
    triton_version = None
    if "triton" in args.kernels or args.triton_variant:
        import triton

        from bass.kernels.triton_attention import attend_triton, plan_launch
        kernels["triton"] = attend_triton
        triton_version = triton.__version__
        for spec in args.triton_variant:
            name, _, opts = spec.partition("=")
            overrides = {k: int(v) for k, v in (kv.split(":") for kv in opts.split(",") if kv)}
            kernels[f"triton:{name}"] = (lambda o: lambda *a: attend_triton(*a, **o))(overrides)
            args.kernels.append(f"triton:{name}")
    heads, kv_heads, head_dim = MODELS[args.model]
    dtype = DTYPES[args.dtype]
    scale = head_dim ** -0.5
    flush = L2Flush(not args.no_flush)
    props = torch.cuda.get_device_properties(0)
    meta = {
        "device": torch.cuda.get_device_name(0), "sm_count": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "python": platform.python_version(), "model": args.model, "heads": heads, "kv_heads": kv_heads,
        "head_dim": head_dim, "dtype": args.dtype, "warmup": args.warmup, "repeats": args.repeats,
        "l2_flush": not args.no_flush, "bounds": args.bounds, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(f"# {meta['device']} ({meta['sm_count']} SMs), torch {meta['torch']}, triton {triton_version}, "
          f"model {args.model} H={heads} Hkv={kv_heads} D={head_dim} {args.dtype}, L2 flush {meta['l2_flush']}")
    if args.host_profile and "triton" in kernels:
        meta["host_profile_us"] = host_profile(heads, kv_heads, head_dim, dtype)
    results = []
    header = (f"{'B':>3} {'q':>3} {'spread':>6} {'kernel':>12} {'graph_ms':>9} {'eager_ms':>9} {'host_us':>8} "
              f"{'max_err':>8}  plan")
    print(header)
    for spread in args.spreads:
        for bs in args.batch_sizes:
            for q_len in args.q_lens:
                q, k_cache, v_cache, batch, ctxs = make_case(bs, q_len, spread, heads, kv_heads, head_dim,
                                                             dtype, args.seed)
                ref = attend_split(q.float(), k_cache.float(), v_cache.float(), batch, scale)
                if args.bounds:
                    batch = replace(batch, max_ctx=args.bounds, ctx_lens_list=[args.bounds] * bs,
                                    ctx_lens_are_bounds=True)
                row = {"batch_size": bs, "q_len": q_len, "spread": spread, "ctx_lens": ctxs,
                       "num_tokens": batch.num_tokens, "kernels": {}}
                if "triton" in kernels:
                    plan = plan_launch(batch.q_lens_list, batch.ctx_lens_list, heads // kv_heads, kv_heads,
                                       head_dim, props.multi_processor_count,
                                       ctx_lens_are_bounds=batch.ctx_lens_are_bounds)
                    row["triton_plan"] = dict(zip(("block_m", "block_n", "num_warps", "num_stages",
                                                   "num_splits", "split_size"), plan))
                for name in args.kernels:
                    fn = kernels[name]
                    call = lambda fn=fn, a=(q, k_cache, v_cache, batch, scale): fn(*a)  # noqa: E731
                    entry: dict = {}
                    try:
                        out = call()
                        torch.cuda.synchronize()
                        entry["max_abs_err"] = (out.float() - ref).abs().max().item()
                        entry["eager"] = summarize(time_eager(call, flush, args.warmup, args.repeats))
                        entry["host_us"] = time_host(call)
                        if not args.no_graph:
                            try:
                                entry["graph"] = summarize(time_graph(call, flush, args.warmup, args.repeats))
                            except Exception as exc:  # capture can fail (e.g. a host sync)
                                entry["graph_error"] = repr(exc)
                                torch.cuda.synchronize()
                    except Exception as exc:
                        entry["error"] = repr(exc)
                    row["kernels"][name] = entry
                    g = entry.get("graph", {}).get("median_ms", float("nan"))
                    e = entry.get("eager", {}).get("median_ms", float("nan"))
                    err = entry.get("max_abs_err", float("nan"))
                    host = entry.get("host_us", float("nan"))
                    plan_s = ""
                    if name == "triton" and "triton_plan" in row:
                        p = row["triton_plan"]
                        plan_s = f"M{p['block_m']} N{p['block_n']} splits={p['num_splits']}"
                    print(f"{bs:>3} {q_len:>3} {spread:>6} {name:>12} {g:>9.4f} {e:>9.4f} {host:>8.1f} {err:>8.1e}  "
                          f"{plan_s}{'  ERROR ' + entry['error'] if 'error' in entry else ''}", flush=True)
                base = row["kernels"].get("triton", {}).get("graph", {}).get("median_ms")
                if base:
                    row["graph_speedup_vs"] = {
                        n: row["kernels"][n]["graph"]["median_ms"] / base
                        for n in args.kernels if n != "triton" and "graph" in row["kernels"].get(n, {})}
                results.append(row)
                del q, k_cache, v_cache, batch, ref
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
