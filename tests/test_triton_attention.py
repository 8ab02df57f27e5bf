"""The Triton ragged-attention kernel against the naive reference and BASS-SPLIT.

Without a GPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set here before Triton is
imported) on small shapes; with one, the same tests run on CUDA tensors and the tests marked `gpu`
add bf16 / fp16 at the real models' shapes. Skipped when Triton is not installed.
"""

import importlib.util
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton

triton = pytest.importorskip("triton")

from bass.kernels.attention import attend_split  # noqa: E402
from bass.kernels.batch import RaggedBatch, SequenceChunk  # noqa: E402
from bass.kernels.triton_attention import _ragged_attn_fwd, attend_triton, plan_launch  # noqa: E402
from test_attention import naive_attention  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
if DEVICE == "cpu" and type(_ragged_attn_fwd).__name__ != "InterpretedFunction":
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; no GPU to run it on",
                allow_module_level=True)

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def make_case(shape, heads, kv_heads, dim, *, dtype=torch.float32, max_len=None, seed=0, device=DEVICE):
    """shape: [(query length, tokens already cached)] per sequence; slots are not in batch order."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = len(shape) + 2
    max_len = max_len or max(q + c for q, c in shape) + 3
    k_cache = torch.randn(num_slots, max_len, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_slots, max_len, kv_heads, dim, generator=gen)
    chunks = [SequenceChunk(slot=num_slots - 1 - s, start=cached, tokens=[0] * q_len, logit_rows=0)
              for s, (q_len, cached) in enumerate(shape)]
    batch = RaggedBatch.build(chunks, device)
    q = torch.randn(batch.num_tokens, heads, dim, generator=gen)
    return q.to(device, dtype), k_cache.to(device, dtype), v_cache.to(device, dtype), batch


def reference(q, k_cache, v_cache, batch, scale):
    """BASS-SPLIT in fp32 (checked against the naive loop in tests/test_attention.py)."""
    return attend_split(q.float(), k_cache.float(), v_cache.float(), batch, scale)


# (heads, kv_heads, head_dim): GQA group 2 with a tiny head, Qwen2.5-0.5B's group 7 at head_dim 64,
# MQA with a head_dim that is not a power of two.
HEADS = [(4, 2, 8), (14, 2, 64), (6, 1, 24)]

SHAPES = [
    # the families of tests/test_attention.py: decode, verify k+1, prefill, mixed
    [(1, 5), (1, 0), (1, 17)],
    [(5, 3), (5, 10), (5, 0)],
    [(9, 0), (1, 12), (4, 4), (2, 30)],
    # verify with k = 32, next to shorter drafts and a decode
    [(33, 50), (17, 3), (1, 80)],
    # a mixed step: decodes, verifies and prefill chunks of several query blocks
    [(1, 100), (33, 10), (5, 0), (48, 20), (1, 0)],
]


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "H{}-Hkv{}-D{}".format(*h))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{q}q{c}c" for q, c in s))
def test_matches_split(shape, heads):
    q, k_cache, v_cache, batch = make_case(shape, *heads)
    scale = 1 / math.sqrt(heads[2])
    torch.testing.assert_close(attend_triton(q, k_cache, v_cache, batch, scale),
                               reference(q, k_cache, v_cache, batch, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=["decode", "verify", "mixed"])
def test_matches_naive(shape):
    q, k_cache, v_cache, batch = make_case(shape, 4, 2, 8)
    args = (q.cpu(), k_cache.cpu(), v_cache.cpu(), RaggedBatch.build(
        [SequenceChunk(slot=s, start=c - n, tokens=[0] * n, logit_rows=0)
         for s, n, c in zip(batch.slots_list, batch.q_lens_list, batch.ctx_lens_list)], "cpu"), 0.3)
    torch.testing.assert_close(attend_triton(q, k_cache, v_cache, batch, 0.3).cpu(), naive_attention(*args),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (64, 32)])
def test_prefill_chunks_span_query_and_key_blocks(block_m, block_n):
    """Chunks longer than one query block, after a cached prefix spanning several key tiles: the
    unmasked tiles, the causal diagonal and the grid's empty blocks all get exercised."""
    shape = [(40, 30), (3, 61), (25, 0)]
    q, k_cache, v_cache, batch = make_case(shape, 14, 2, 16, seed=1)
    got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_m=block_m, block_n=block_n)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize("shape", [[(1, 90), (1, 7)], [(5, 60), (33, 40), (1, 0)]], ids=["decode", "mixed"])
def test_split_kv_matches(shape, num_splits):
    """Split-KV: splits past a row's position (or past a short sequence's context) are skipped."""
    q, k_cache, v_cache, batch = make_case(shape, 6, 2, 16, seed=2)
    got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_n=16, num_splits=num_splits)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [13, 26])
def test_split_kv_merges_more_splits_than_it_loads_at_once(num_splits):
    """The last split to arrive reads the partials 8 splits at a time (MERGE_SPLITS): a context cut
    into more runs than that, beside one that has keys in only two of them, merges them all."""
    q, k_cache, v_cache, batch = make_case([(1, 400), (4, 20), (2, 150)], 6, 2, 16, seed=5)
    plan = plan_launch(batch.q_lens_list, batch.ctx_lens_list, 3, 2, 16, 8, block_n=16, num_splits=num_splits)
    assert plan.num_splits == num_splits
    got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_n=16, num_splits=num_splits)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [None, 4])
@pytest.mark.parametrize("shape", [[(1, 90), (1, 7), (1, 0)], [(5, 60), (5, 3), (5, 200)]], ids=["decode", "verify"])
def test_split_kv_sized_on_device(shape, num_splits):
    """A CUDA graph's batch knows only the cache's capacity on the host (ctx_lens_are_bounds):
    each sequence then cuts its own context into the grid's splits, down to one tile, and short
    contexts in a plan made for the longest one still attend correctly."""
    q, k_cache, v_cache, batch = make_case(shape, 6, 2, 16, max_len=512, seed=5)
    bound = replace(batch, max_ctx=512, ctx_lens_list=[512] * batch.num_seqs, ctx_lens_are_bounds=True)
    plan = plan_launch(bound.q_lens_list, bound.ctx_lens_list, 3, 2, 16, 8, block_n=16, num_splits=num_splits,
                       ctx_lens_are_bounds=True)
    assert plan.split_size == 16  # the floor is one tile
    got = attend_triton(q, k_cache, v_cache, bound, 0.25, block_n=16, num_splits=num_splits)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


def test_split_kv_counters_are_left_zeroed_for_the_next_launch():
    """One arrivals buffer serves launch after launch (every layer, inside CUDA graphs): each
    block's last split resets its counter, so no memset is needed between calls."""
    arrivals = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    for seed, shape in enumerate([[(1, 90), (1, 7)], [(5, 60), (5, 3), (1, 0)], [(1, 200)]]):
        q, k_cache, v_cache, batch = make_case(shape, 6, 2, 16, seed=seed)
        for _ in range(2):
            got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_n=16, num_splits=4, arrivals=arrivals)
            torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)
            assert not arrivals.any()
    # A buffer too small for the grid is not used (nor overrun).
    q, k_cache, v_cache, batch = make_case([(5, 60)] * 3, 6, 2, 16, seed=9)
    small = torch.full((2,), 7, dtype=torch.int32, device=DEVICE)
    got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_n=16, num_splits=4, arrivals=small)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)
    assert small.tolist() == [7, 7]


@pytest.mark.parametrize("num_splits", [1, 4])
def test_programmatic_launch_reads_what_the_kernel_before_it_wrote(num_splits):
    """Launched as a programmatic dependent launch (on a GPU of sm_90 or newer; elsewhere the flag
    is ignored) right behind the kernels that write its query and its cache, the kernel waits for
    them: the same bits as a serial launch, split-KV merge included."""
    q, k_cache, v_cache, batch = make_case([(1, 90), (5, 60), (1, 7)], 6, 2, 16, seed=4)
    outs = {}
    for programmatic in (False, True):
        q2, k2, v2 = q * 1.0, k_cache * 1.0, v_cache * 1.0  # written by kernels just before the launch
        outs[programmatic] = attend_triton(q2, k2, v2, batch, 0.25, block_n=16, num_splits=num_splits,
                                           programmatic=programmatic)
    assert torch.equal(outs[True], outs[False])
    torch.testing.assert_close(outs[True], reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


def test_split_heuristic():
    sms = 132
    # batch 1, decode, long context: too few programs for the GPU, so the context is split.
    plan = plan_launch([1], [2048], 6, 2, 128, sms)
    assert plan.num_splits > 1 and plan.split_size % plan.block_n == 0
    assert plan.num_splits * plan.split_size >= 2048 > (plan.num_splits - 1) * plan.split_size
    assert plan_launch([1] * 8, [100] * 7 + [2048], 6, 2, 128, sms).num_splits > 1
    # batch 64 decode fills the GPU; short contexts are never split.
    assert plan_launch([1] * 64, [2048] * 64, 6, 2, 128, sms).num_splits == 1
    assert plan_launch([1], [512], 6, 2, 128, sms).num_splits == 1
    # ... unless the lengths are bounds (a CUDA graph): each sequence then splits its own context
    bound = plan_launch([1] * 8, [536] * 8, 7, 2, 64, sms, ctx_lens_are_bounds=True)
    assert bound.num_splits == 5 and bound.split_size == bound.block_n  # 8 runs of whole tiles: 5 of 128 keys
    assert plan_launch([1] * 8, [2048] * 8, 7, 2, 64, sms, ctx_lens_are_bounds=True).num_splits == 8
    # an explicit split count is clamped to whole tiles of the longest context
    assert plan_launch([1], [100], 6, 2, 128, sms, num_splits=8).num_splits == 2
    # a tiny batch that is split also takes 16-row query blocks
    plan = plan_launch([9], [2048], 6, 2, 128, sms)
    assert plan.num_splits > 1 and plan.block_m == 16
    assert plan_launch([33] * 8, [2048] * 8, 6, 2, 128, sms).block_m == 128
    # query blocks: one 16-row block for a decode step of group 6, 64 rows once q_len * group > 32.
    assert plan_launch([1, 1], [10, 10], 6, 2, 128, sms).block_m == 16
    assert plan_launch([5, 1], [10, 10], 6, 2, 128, sms).block_m == 32
    assert plan_launch([9, 1], [10, 10], 6, 2, 128, sms).block_m == 64


def test_automatic_split_on_long_context():
    """On the CPU the wrapper assumes 8 SMs, so one long sequence takes the split-KV path."""
    q, k_cache, v_cache, batch = make_case([(2, 1100)], 4, 2, 16, seed=3)
    plan = plan_launch(batch.q_lens_list, batch.ctx_lens_list, 2, 2, 16,
                       torch.cuda.get_device_properties(0).multi_processor_count if HAS_CUDA else 8)
    assert plan.num_splits > 1
    torch.testing.assert_close(attend_triton(q, k_cache, v_cache, batch, 0.25),
                               reference(q, k_cache, v_cache, batch, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_keys_beyond_context_are_ignored(num_splits):
    """Garbage past each sequence's context (rolled-back drafts, other sequences' slots) and NaN in
    unused slots must not leak into attention."""
    q, k_cache, v_cache, batch = make_case([(2, 40), (1, 8), (3, 0)], 4, 2, 16, max_len=64, seed=4)
    before = attend_triton(q, k_cache, v_cache, batch, 0.5, block_n=16, num_splits=num_splits)
    for slot, ctx in zip(batch.slots_list, batch.ctx_lens_list):
        k_cache[slot, ctx:] = 1e4
        v_cache[slot, ctx:] = float("nan")
    used = set(batch.slots_list)
    for slot in range(k_cache.shape[0]):
        if slot not in used:
            k_cache[slot] = float("nan")
            v_cache[slot] = float("nan")
    after = attend_triton(q, k_cache, v_cache, batch, 0.5, block_n=16, num_splits=num_splits)
    torch.testing.assert_close(after, before)


def test_strided_inputs():
    """q sliced out of a wider tensor and caches that are one layer of a [layers, ...] buffer."""
    shape = [(5, 12), (1, 30)]
    _, k_all, v_all, batch = make_case(shape, 4, 2, 16, seed=5)
    k_layers = torch.stack([torch.randn_like(k_all), k_all])
    v_layers = torch.stack([torch.randn_like(v_all), v_all])
    wide = torch.randn(batch.num_tokens, 4, 40, device=DEVICE)
    q = wide[:, :, 8:24]
    assert not q.is_contiguous()
    got = attend_triton(q, k_layers[1], v_layers[1], batch, 0.25)
    assert got.is_contiguous()
    torch.testing.assert_close(got, reference(q, k_all, v_all, batch, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(dtype):
    q, k_cache, v_cache, batch = make_case([(5, 20), (1, 40), (17, 0)], 14, 2, 16, dtype=dtype, seed=6)
    got = attend_triton(q, k_cache, v_cache, batch, 0.25, block_n=16)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), reference(q, k_cache, v_cache, batch, 0.25), atol=2e-2, rtol=2e-2)


def test_rejects_bad_inputs():
    q, k_cache, v_cache, batch = make_case([(2, 3)], 4, 2, 16)
    with pytest.raises(ValueError, match="dtype"):
        attend_triton(q.double(), k_cache.double(), v_cache.double(), batch, 0.5)
    with pytest.raises(ValueError, match="dtype"):
        attend_triton(q.half(), k_cache, v_cache, batch, 0.5)
    with pytest.raises(ValueError, match="multiple"):
        attend_triton(q[:, :3], k_cache, v_cache, batch, 0.5)
    with pytest.raises(ValueError, match="tokens"):
        attend_triton(q[:1], k_cache, v_cache, batch, 0.5)


def test_import_without_triton(monkeypatch):
    """The registry imports the module lazily; without Triton, importing works and calling says why."""
    path = Path(__file__).resolve().parent.parent / "kernels" / "triton_attention.py"
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("_triton_attention_without_triton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.triton_available()
    q, k_cache, v_cache, batch = make_case([(1, 3)], 2, 1, 8, device="cpu")
    with pytest.raises(RuntimeError, match="needs the triton package"):
        module.attend_triton(q, k_cache, v_cache, batch, 0.5)


# ---------------------------------------------------------------------------------------------
# GPU only: the real models' shapes in half precision, and capture in a CUDA graph (no host sync)
# ---------------------------------------------------------------------------------------------
QWEN = {"qwen1.5b": (12, 2, 128), "qwen0.5b": (14, 2, 64)}


def _gpu_shapes():
    import random
    rng = random.Random(0)
    return {
        "decode64": [(1, rng.randint(64, 2048)) for _ in range(64)],
        "verify32": [(rng.choice([5, 9]), rng.randint(64, 2048)) for _ in range(32)],
        "verify-k32": [(33, rng.randint(0, 1024)) for _ in range(8)],
        "decode1-long": [(1, 4000)],
        "verify2-long": [(9, 3000), (5, 2500)],
        "prefill-mixed": [(300, 0), (1, 1500), (5, 700), (200, 512)],
    }


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("model", sorted(QWEN))
@pytest.mark.parametrize("shape_name", sorted(_gpu_shapes()))
def test_gpu_qwen_shapes(shape_name, model, dtype):
    heads, kv_heads, dim = QWEN[model]
    q, k_cache, v_cache, batch = make_case(_gpu_shapes()[shape_name], heads, kv_heads, dim, dtype=dtype,
                                           seed=7, device="cuda")
    scale = dim ** -0.5
    got = attend_triton(q, k_cache, v_cache, batch, scale)
    ref = reference(q, k_cache, v_cache, batch, scale)
    assert torch.isfinite(got).all()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("plan", [dict(block_m=64, num_splits=1, mask_every_tile=True),
                                  dict(block_m=64, split_keys=64, mask_every_tile=True), dict(batch_invariant=True)],
                         ids=["one-pass", "fixed-splits", "the-mode's"])
def test_invariant_plan_gives_a_query_the_same_output_in_decode_and_verification(plan, row_exact_interpreter_dot):
    """The batch-invariant plans (block_m 64, every tile masked, and no split or splits of a
    fixed size from key 0): the query at position P gives bitwise the same output as the one
    query of a decode step, as one of the k + 1 queries of a verification (any of its rows), and
    beside other sequences (a longer one among them, so that the grid has more splits), for
    positions on both sides of key-tile and split boundaries. (On an H100 without
    mask_every_tile, bf16 seeded text changed between regular and speculative decoding in 5 of
    32 HumanEval prompts.)"""
    heads, kv_heads, dim = (14, 2, 64)
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    gen = torch.Generator().manual_seed(11)
    max_len = 200
    k_cache = torch.randn(3, max_len, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(3, max_len, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    scale = dim ** -0.5
    for ctx in (62, 64, 66, 68, 127, 129, 131, 196) if HAS_CUDA else (64, 68, 127, 131):
        q = torch.randn(5, heads, dim, generator=gen).to(DEVICE, dtype)
        verify = RaggedBatch.build([SequenceChunk(slot=1, start=ctx - 5, tokens=[0] * 5, logit_rows=0)], DEVICE)
        by_verify = attend_triton(q, k_cache, v_cache, verify, scale, **plan)
        for i in range(5):
            decode = RaggedBatch.build([SequenceChunk(slot=0, start=190, tokens=[0] * 3, logit_rows=0),
                                        SequenceChunk(slot=1, start=ctx - 5 + i, tokens=[0], logit_rows=0)], DEVICE)
            others = torch.randn(3, heads, dim, generator=gen).to(DEVICE, dtype)
            by_decode = attend_triton(torch.cat([others, q[i:i + 1]]), k_cache, v_cache, decode, scale, **plan)
            assert torch.equal(by_decode[3], by_verify[i]), (ctx, i)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_gpu_cuda_graph_capture(num_splits):
    """No host sync in the wrapper: the call captures into a CUDA graph and replays correctly."""
    heads, kv_heads, dim = QWEN["qwen1.5b"]
    q, k_cache, v_cache, batch = make_case([(5, 900), (1, 1200), (9, 40)], heads, kv_heads, dim,
                                           dtype=torch.bfloat16, seed=8, device="cuda")
    scale = dim ** -0.5
    attend_triton(q, k_cache, v_cache, batch, scale, num_splits=num_splits)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_triton(q, k_cache, v_cache, batch, scale, num_splits=num_splits)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), reference(q, k_cache, v_cache, batch, scale), atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
def test_gpu_split_kv_merge_is_race_free():
    """The last split to arrive merges the others' partials: repeated runs must agree bit for bit
    (a read of a partial not yet written would make them differ)."""
    heads, kv_heads, dim = QWEN["qwen1.5b"]
    q, k_cache, v_cache, batch = make_case([(1, 3000), (9, 2500), (5, 100), (33, 1800)], heads, kv_heads, dim,
                                           dtype=torch.bfloat16, seed=9, device="cuda")
    scale = dim ** -0.5
    first = attend_triton(q, k_cache, v_cache, batch, scale, num_splits=12)
    torch.testing.assert_close(first.float(), reference(q, k_cache, v_cache, batch, scale), atol=2e-2, rtol=2e-2)
    for _ in range(200):
        assert torch.equal(attend_triton(q, k_cache, v_cache, batch, scale, num_splits=12), first)
