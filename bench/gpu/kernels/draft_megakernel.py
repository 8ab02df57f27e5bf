"""The draft's one-token forward as one persistent launch (kernels/triton_megakernel.py) against
today's (engine/model.Transformer.hidden: ~10 kernels a layer), on random weights at the
0.5B draft's real shapes (bf16, int8 projections and LM head), 512-token contexts.

Checks first, on fresh random inputs at every batch size: the persistent launch against the
existing path (relative error of the hidden rows, the keys / values it writes, greedy tokens of
the logits), against its own stage mode (one launch per stage: bit for bit, or a barrier is
wrong) and against itself (bit for bit: the split sums are ordered). Then times, as CUDA graphs
(the draft loop's way), medians of per-replay CUDA events: the hidden rows alone and the whole
draft forward (+ the int8 LM head + argmax), for each plan variant; each stage's marginal cost
(the launch with that stage left out); the barriers alone; and a device copy's bandwidth for the
floor.

    PYTHONPATH=... python3 bench/gpu/kernels/draft_megakernel.py OUT_DIR [BATCHES]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bass.bench.steps import random_transformer, shape_config
from bass.engine.batch import SequenceChunk
from bass.engine.graphs import StaticInputs, capture
from bass.engine.kv_cache import KVCache
from bass.kernels import triton_megakernel as M

CONTEXT = 512
STAGE_NAMES = ("A qkv+rope", "B attention", "C o+residual", "D norm+gate_up+silu", "E down+residual")


def median_ms(fn, repeats: int = 100, warmup: int = 10) -> float:
    times = []
    for i in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def back_to_back_ms(fn, n: int = 20, rounds: int = 7) -> float:
    """Per call, n calls queued back to back between two events (no gap for the host)."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / n)
    return statistics.median(per)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + written)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), repeats=20, warmup=3)
    del a, b
    return 2 * (1 << 30) / (ms * 1e-3) / 1e9


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


@torch.inference_mode()
def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,4,8,16").split(",")]
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    cfg = shape_config("qwen2.5-coder-0.5b")
    max_len = CONTEXT + 64
    model = random_transformer(cfg, dtype="bfloat16", device="cuda", max_seq_len=max_len, attention="triton",
                               int8_weights=True)
    for layer in model.weights.layers:  # norms other than ones, so that a wrong norm shows
        layer.input_norm.copy_(1 + 0.2 * torch.randn_like(layer.input_norm))
        layer.post_norm.copy_(1 + 0.2 * torch.randn_like(layer.post_norm))
    model.weights.final_norm.copy_(1 + 0.2 * torch.randn_like(model.weights.final_norm))
    t0 = time.perf_counter()
    mk = M.DraftMegakernel(model)
    base_plan = mk.plan
    print(f"{props.name}, {props.multi_processor_count} SMs; plan {base_plan}; built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    cache = KVCache(num_layers=cfg.num_layers, num_slots=17, max_seq_len=max_len, num_kv_heads=cfg.num_kv_heads,
                    head_dim=cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    bw = copy_bandwidth()
    c = cfg
    weight_bytes = c.num_layers * (mk.layer_bytes + mk.ws.shape[1] * 4)
    lm_head_bytes = c.vocab_size * c.hidden_size + c.vocab_size * 4
    print(f"copy bandwidth {bw:.0f} GB/s; int8 layer weights + scales {weight_bytes / 1e6:.1f} MB, "
          f"LM head {lm_head_bytes / 1e6:.1f} MB", flush=True)

    sms = base_plan.programs
    variants = {
        "default": base_plan,
        "no prefetch": dataclasses.replace(base_plan, prefetch=False),
        "8 warps": dataclasses.replace(base_plan, num_warps=8),
        "no prefetch, 8 warps": dataclasses.replace(base_plan, prefetch=False, num_warps=8),
    }
    skips = {"barriers only (all stages out)": 31, **{f"without {name}": 1 << i for i, name in enumerate(STAGE_NAMES)}}
    skip_plan = None  # the skips run on the variant fastest at the first batch size
    pool = torch.cuda.graph_pool_handle()
    rows = []
    for batch_size in batches:
        gen = torch.Generator().manual_seed(batch_size)
        inputs = StaticInputs(batch_size, 1, 1, 16, max_len, torch.device("cuda"))
        chunks = [SequenceChunk(slot=i, start=CONTEXT - 17 + (i * 37) % 50, tokens=[int(torch.randint(0, c.vocab_size, (1,), generator=gen))],
                                logit_rows=1) for i in range(batch_size)]
        inputs.fill(chunks)
        batch = inputs.batch
        kv_bytes = sum(2 * c.num_layers * (ch.start + 1) * c.num_kv_heads * c.head_dim * 2 for ch in chunks)
        floor_hidden = (weight_bytes + kv_bytes) / bw / 1e6
        floor_full = floor_hidden + lm_head_bytes / bw / 1e6
        row = {"batch": batch_size, "kv_bytes": kv_bytes, "floor_hidden_ms": round(floor_hidden, 4),
               "floor_forward_ms": round(floor_full, 4)}

        # -- correctness ----------------------------------------------------------------------
        saved = (cache.k.clone(), cache.v.clone())

        def restore():
            cache.k.copy_(saved[0])
            cache.v.copy_(saved[1])

        want = model.hidden(batch, cache).clone()
        want_k, want_v = cache.k.clone(), cache.v.clone()
        restore()
        got = mk(batch, cache).clone()
        torch.cuda.synchronize()
        got_k, got_v = cache.k.clone(), cache.v.clone()
        restore()
        staged = mk(batch, cache, stage_mode=True).clone()
        restore()
        again = mk(batch, cache).clone()
        restore()
        want_tok = model.logits(want).argmax(-1)
        got_tok = model.logits(got).argmax(-1)
        row["check"] = {
            "hidden_rel_err_vs_existing": rel(got, want),
            "hidden_max_abs_err_vs_existing": float((got.float() - want.float()).abs().max()),
            "k_written_rel_err": rel(got_k, want_k) if not torch.equal(got_k, want_k) else 0.0,
            "v_written_rel_err": rel(got_v, want_v) if not torch.equal(got_v, want_v) else 0.0,
            # the same (layer, slot, position, head) entries written, nothing else
            "same_cache_entries_written": bool(torch.equal((got_k != saved[0]).any(-1), (want_k != saved[0]).any(-1))
                                               and torch.equal((got_v != saved[1]).any(-1),
                                                               (want_v != saved[1]).any(-1))),
            "greedy_tokens_equal": int((want_tok == got_tok).sum()), "rows": batch_size,
            "persistent_equals_stage_mode": bool(torch.equal(got, staged)),
            "persistent_repeats_bit_for_bit": bool(torch.equal(got, again)),
            "error_flag": mk.error_flag(),
            "counters_left_zero": int(mk.counters.count_nonzero()) == 0,
        }
        del saved, want_k, want_v, got_k, got_v
        print(f"batch {batch_size}: {row['check']}", flush=True)

        # -- timing (CUDA graphs) ----------------------------------------------------------------
        def graph_of(fn):
            graph, _ = capture(pool, fn, fn)
            return graph.replay

        timings = {}

        def time_pair(name, hidden_fn):
            g_hidden = graph_of(hidden_fn)
            g_full = graph_of(lambda: model.logits(hidden_fn()).argmax(-1))
            timings[name] = {"hidden_ms": median_ms(g_hidden), "forward_ms": median_ms(g_full),
                             "hidden_back_to_back_ms": back_to_back_ms(g_hidden),
                             "forward_back_to_back_ms": back_to_back_ms(g_full)}
            t = timings[name]
            print(f"  {name:38s} hidden {t['hidden_ms']:.4f} ({t['hidden_back_to_back_ms']:.4f} b2b)  forward "
                  f"{t['forward_ms']:.4f} ({t['forward_back_to_back_ms']:.4f} b2b) ms", flush=True)

        time_pair("existing", lambda: model.hidden(batch, cache))
        for name, plan in variants.items():
            mk.plan = plan
            mk(batch, cache)  # compiled, and the programs co-resident? (a barrier that gave up says not)
            if mk.error_flag():
                print(f"  megakernel {name}: a barrier gave up (programs not co-resident); skipped", flush=True)
                timings[f"megakernel {name}"] = {"error": "not co-resident"}
                mk.counters.zero_()
                continue
            time_pair(f"megakernel {name}", lambda: mk(batch, cache))
        if skip_plan is None:
            fastest = min((k for k in timings if k.startswith("megakernel") and "hidden_ms" in timings[k]),
                          key=lambda k: timings[k]["hidden_ms"])
            skip_plan = (fastest, variants[fastest.removeprefix("megakernel ")])
            print(f"  stage costs measured on: {skip_plan[0]}", flush=True)
        row["skip_variant"] = skip_plan[0]
        timings["skip base"] = timings[skip_plan[0]]
        for name, skip in skips.items():
            mk.plan = dataclasses.replace(skip_plan[1], skip=skip)
            g = graph_of(lambda: mk(batch, cache))
            timings[f"megakernel {name}"] = {"hidden_ms": median_ms(g), "hidden_back_to_back_ms": back_to_back_ms(g)}
            print(f"  megakernel {name:27s} hidden {timings[f'megakernel {name}']['hidden_ms']:.4f}", flush=True)
        mk.plan = base_plan
        restore_flag = mk.error_flag()
        row["timings"] = timings
        row["error_flag_after_timing"] = restore_flag
        rows.append(row)
        torch.cuda.empty_cache()

    result = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "triton": __import__("triton").__version__, "context": CONTEXT, "copy_bandwidth_GBps": round(bw, 1),
              "layer_weight_bytes": weight_bytes, "lm_head_bytes": lm_head_bytes,
              "plan": dataclasses.asdict(base_plan), "rows": rows}
    (out_dir / "draft_megakernel.json").write_text(json.dumps(result, indent=1))

    print("\n| batch | existing hidden | megakernel hidden | existing forward (+LM head, argmax) | megakernel forward "
          "| speed-up (forward) | megakernel hidden % of floor | best variant |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        t = row["timings"]
        ex, mg = t["existing"], t["megakernel default"]
        best = min((k for k in t if "forward_ms" in t[k] and k.startswith("megakernel")), key=lambda k: t[k]["forward_ms"])
        print(f"| {row['batch']} | {ex['hidden_ms']:.3f} | {mg['hidden_ms']:.3f} | {ex['forward_ms']:.3f} | "
              f"{mg['forward_ms']:.3f} | {ex['forward_ms'] / mg['forward_ms']:.2f}x | "
              f"{100 * row['floor_hidden_ms'] / mg['hidden_ms']:.0f}% | {best}: hidden {t[best]['hidden_ms']:.3f}, "
              f"forward {t[best]['forward_ms']:.3f} ({ex['forward_ms'] / t[best]['forward_ms']:.2f}x), "
              f"{100 * row['floor_hidden_ms'] / t[best]['hidden_ms']:.0f}% of the floor |")
    print("\nmarginal cost of each stage over 24 layers (default minus without it), ms:")
    for row in rows:
        t = row["timings"]
        full = t["skip base"]["hidden_ms"]
        parts = ", ".join(f"{name.split()[0]} {full - t[f'megakernel without {name}']['hidden_ms']:.3f}"
                          for name in STAGE_NAMES)
        print(f"  batch {row['batch']} ({row['skip_variant']}): all {full:.3f}; barriers only {t['megakernel barriers only (all stages out)']['hidden_ms']:.3f}; {parts}")


if __name__ == "__main__":
    main()
