"""The CUDA few-row products (kernels/cuda/skinny_gemm.cu, kernels/cuda_skinny.py) and the plans
that route a model's projections to them (kernels/skinny_linear.py).

On the CPU: the source compiles for Hopper (where nvcc is installed), launch shapes fit the
kernel's shared memory, and the router sends to the kernel only what a plan covers. On a GPU:
every launch shape against the fp32 product of the same (dequantized) weight, and a model whose
projections run through the kernel gives the logits of the model without it.
"""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from bass.kernels.cuda_skinny import MAX_ROWS, Launch, SplitScratch, launch_for, load_skinny_gemm, row_groups_for
from bass.kernels.skinny_linear import ROW_BUCKETS, SkinnyLinear

CUDA = torch.cuda.is_available()


def test_no_kernel_without_a_gpu():
    assert load_skinny_gemm(torch.device("cpu")) is None


@pytest.mark.parametrize("int8", [True, False])
def test_launch_shapes_cover_the_rows_and_fit_shared_memory(int8):
    for rows in range(1, MAX_ROWS + 1):
        groups = row_groups_for(rows)
        assert 4 * groups < rows <= 8 * groups or groups == 1  # the smallest launch that holds the rows
        for cols, inner in ((8, 896), (1152, 896), (9728, 896), (896, 4864), (1536, 8960), (151936, 1536)):
            launch = launch_for(rows, cols, inner, int8)
            assert launch.row_groups == groups and launch.fits()
            # the kernel's partial sums: warps x column groups x row groups x 128 fp32 in 48 KB of static shared memory
            assert launch.warps * launch.column_groups * launch.row_groups * 512 <= 48 * 1024
            assert launch.warps in (2, 4, 8, 16) and launch.column_groups in (1, 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
def test_build_kernels_compiles_for_hopper_into_the_cache_the_loader_reads(tmp_path, monkeypatch):
    """`bass build-kernels --arch 90` on a machine without a GPU: the source compiles, the library
    exports its entry point, lands under the name the loader looks for, and is not rebuilt."""
    from click.testing import CliRunner

    from bass.app.cli import main
    from bass.kernels.cuda_skinny import library_name, load_library

    monkeypatch.setenv("BASS_KERNEL_CACHE", str(tmp_path))
    first = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert first.exit_code == 0, first.output
    assert str(tmp_path / library_name("90")) in first.output
    assert (tmp_path / library_name("90")).is_file() and load_library("90") is not None
    assert hasattr(ctypes.CDLL(str(tmp_path / library_name("90"))), "bass_skinny_gemm")
    again = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert again.exit_code == 0 and "already built" in again.output


def test_build_kernels_says_what_is_missing(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import bass.kernels.cuda_skinny as cuda_skinny
    from bass.app.cli import main

    bad = CliRunner().invoke(main, ["build-kernels", "--arch", "7x"])
    assert bad.exit_code == 2 and "compute capability" in bad.output
    old = CliRunner().invoke(main, ["build-kernels", "--arch", "75"])
    assert old.exit_code == 2 and "80 or more" in old.output
    if not CUDA:
        no_gpu = CliRunner().invoke(main, ["build-kernels"])
        assert no_gpu.exit_code == 2 and "--arch" in no_gpu.output
    monkeypatch.setattr(cuda_skinny, "find_nvcc", lambda: None)
    no_nvcc = CliRunner().invoke(main, ["build-kernels", "--arch", "90"])
    assert no_nvcc.exit_code == 1 and "no nvcc" in no_nvcc.output


def test_a_cache_that_cannot_be_written_or_read_leaves_the_fallback(tmp_path, monkeypatch, caplog):
    """No kernel, a warning, and no error for the model that asked: an unwritable cache (a path
    under a file) and a library file that does not load."""
    import bass.kernels.cuda_skinny as cuda_skinny
    from bass.kernels.cuda_skinny import library_name, load_library

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BASS_KERNEL_CACHE", str(blocker / "kernels"))
    monkeypatch.setattr(cuda_skinny, "find_nvcc", lambda: "/nonexistent/nvcc")  # the cache fails before it runs
    assert load_library("90") is None
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / library_name("90")).write_bytes(b"not a shared library")
    monkeypatch.setenv("BASS_KERNEL_CACHE", str(cache))
    assert load_library("90") is None
    assert "unavailable" in caplog.text and "stay on Triton / cuBLAS" in caplog.text


class _RecordingKernel:
    def __init__(self):
        self.calls = []

    def __call__(self, x, w, scale, bias, out, launch, split=None, **epilogue):
        self.calls.append((x.shape[0], tuple(w.shape), launch,
                           *sorted(k for k, v in epilogue.items() if v is not None and v is not False)))
        return out.fill_(7)


def test_a_split_launch_refuses_to_run_without_room_for_its_partial_sums():
    from bass.kernels.cuda_skinny import SkinnyGemm

    class _Library:
        class bass_skinny_gemm:  # noqa: N801 - stands in for the C function; never reached
            def __call__(self, *args):
                raise AssertionError("launched")

    kernel = SkinnyGemm(_Library())
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(4096, 64, dtype=torch.bfloat16)
    small = SplitScratch(torch.device("cpu"), floats=1024, tiles=8)
    with pytest.raises(ValueError, match="SplitScratch"):
        kernel(x, w, None, None, torch.empty(4, 4096, dtype=torch.bfloat16), Launch(1, 1, 4, 0, 2), small)
    with pytest.raises(ValueError, match="SplitScratch"):
        kernel(x, w, None, None, torch.empty(4, 4096, dtype=torch.bfloat16), Launch(1, 1, 4, 0, 2), None)


@pytest.mark.parametrize("programmatic", [False, True])
def test_the_launch_says_whether_it_is_a_programmatic_dependent_launch(programmatic, monkeypatch):
    """The library's entry point gets the flag as its second-to-last argument (before the stream)."""
    from bass.kernels.cuda_skinny import SkinnyGemm

    class _Library:
        class bass_skinny_gemm:  # noqa: N801 - stands in for the C function
            calls = []

            def __call__(self, *args):
                self.calls.append(args)
                return 0

        bass_skinny_gemm = bass_skinny_gemm()

    library = _Library()
    kernel = SkinnyGemm(library, programmatic=programmatic)
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(32, 64, dtype=torch.bfloat16)
    # the stub library launches nothing: any stream handle will do (the CPU has none)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    kernel(x, w, None, None, torch.empty(4, 32, dtype=torch.bfloat16), Launch(1, 1, 4))
    (args,) = library.bass_skinny_gemm.calls
    assert args[-2] == int(programmatic)


def test_router_takes_only_planned_shapes_and_row_counts():
    kernel = _RecordingKernel()
    fallback_calls = []

    def fallback(x, w, bias=None, out_dtype=None):
        fallback_calls.append((x.shape[0], x.dtype, out_dtype))
        return F.linear(x, w, bias)

    w_small, w_wide = torch.zeros(24, 64, dtype=torch.bfloat16), torch.zeros(40, 64, dtype=torch.bfloat16)
    launch = Launch(1, 1, 4)
    linear = SkinnyLinear(kernel, fallback, {((24, 64), torch.bfloat16, ROW_BUCKETS[0]): launch}, [])
    x = torch.ones(8, 64, dtype=torch.bfloat16)
    assert bool((linear(x, w_small) == 7).all()) and kernel.calls == [(8, (24, 64), launch)]
    linear(x[:3], w_wide)  # no plan for this shape
    linear(torch.ones(12, 64, dtype=torch.bfloat16), w_small)  # 9-16 rows: no plan in that bucket
    linear(torch.ones(40, 64, dtype=torch.bfloat16), w_small)  # past 16 rows
    linear(torch.ones(4, 64), w_small.float())  # fp32 activations
    linear(x, w_small, None, torch.float32)
    assert len(kernel.calls) == 2 and kernel.calls[1][0] == 8
    assert fallback_calls == [(3, torch.bfloat16, None), (12, torch.bfloat16, None), (40, torch.bfloat16, None),
                              (4, torch.float32, None)]


def test_fused_products_take_the_best_timed_launch_routed_or_not():
    """A fused layer's products run on the kernel whatever the plan routes: with the fastest launch
    timed for the shape and bucket, else the default; epilogues and output shapes as asked."""
    kernel = _RecordingKernel()
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    routed, timed_only = Launch(1, 1, 4), Launch(2, 2, 8)
    key = ((32, 64), torch.bfloat16)
    linear = SkinnyLinear(kernel, F.linear, {(*key, 8): routed}, [], None, {(*key, 8): routed, (*key, 16): timed_only})
    act = linear.fused(torch.ones(5, 64, dtype=torch.bfloat16), w, norm_eps=1e-6, silu_pairs=True)
    assert act.shape == (5, 16) and kernel.calls[-1] == (5, (32, 64), routed, "norm_eps", "silu_pairs")
    stream = torch.zeros(12, 32, dtype=torch.bfloat16)
    assert linear.fused(torch.ones(12, 64, dtype=torch.bfloat16), w, out=stream, residual=stream) is stream
    assert kernel.calls[-1] == (12, (32, 64), timed_only, "residual")
    untimed = torch.zeros(48, 64, dtype=torch.bfloat16)
    linear.fused(torch.ones(3, 64, dtype=torch.bfloat16), untimed)
    assert kernel.calls[-1][2] == launch_for(3, 48, 64, False)
    assert linear(torch.ones(12, 64, dtype=torch.bfloat16), w).shape == (12, 32)  # plain: bucket 16 not routed
    assert len(kernel.calls) == 3


gpu = pytest.mark.skipif(not CUDA or shutil.which("nvcc") is None, reason="needs a CUDA GPU and nvcc")


@pytest.fixture(scope="module")
def kernel():
    k = load_skinny_gemm(torch.device("cuda"))
    assert k is not None, "the CUDA kernel did not build"
    return k


@gpu
@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("cols,inner", [(1000, 896), (64, 4864), (2056, 1536)])
def test_products_equal_fp32_of_the_same_weights_for_every_launch_shape(kernel, int8, rows, cols, inner):
    from bass.kernels.triton_int8 import Int8Weight

    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    full = (torch.randn(cols, inner, device="cuda", generator=gen) / inner ** 0.5).bfloat16()
    weight = Int8Weight.quantize(full) if int8 else None
    w = weight.q if int8 else full
    reference_w = weight.dequantized() if int8 else full.float()
    x = torch.randn(rows, inner, device="cuda", generator=gen).bfloat16()
    bias = torch.randn(cols, device="cuda", generator=gen).bfloat16()
    want = x.float() @ reference_w.T + bias.float()
    split = SplitScratch(torch.device("cuda"))
    for groups in (1, 2):
        for warps in (2, 4, 8, 16):
            for per_sm, ways in ((0, 1), (1, 1), (0, 2), (0, 3), (0, 64)):  # 64 ways: more than the chunks
                launch = Launch(row_groups_for(rows), groups, warps, per_sm, ways)
                if not launch.fits() or not split.holds(launch, cols):
                    continue
                out = torch.full((rows, cols), float("nan"), device="cuda")
                kernel(x, w, weight.scale if int8 else None, bias, out, launch, split)
                torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3, msg=f"{launch}")
                again = torch.empty(rows, cols, device="cuda")
                kernel(x, w, weight.scale if int8 else None, bias, again, launch, split)
                assert torch.equal(out, again)  # a fixed order of sums: the same bits every call
                assert int(split.arrivals.count_nonzero()) == 0  # counters left zeroed for the next call
    out16 = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
    kernel(x, w, weight.scale if int8 else None, None, out16)
    torch.testing.assert_close(out16.float(), want - bias.float(), rtol=2e-2, atol=2e-2)


@gpu
@pytest.mark.parametrize("int8", [False, True])
def test_a_model_routed_through_the_kernel_decodes_as_without_it(qwen_target, int8):
    """Every projection shape forced onto the kernel (min_gain -1): prefill (cuBLAS, > 16 rows) and
    decode steps (the kernel) give the logits of the same model on its own path, bf16 rounding
    apart, and the same greedy tokens."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.model import Transformer
    from bass.engine.runner import ModelRunner
    from bass.engine.weights import load_config, load_weights
    from bass.kernels.skinny_linear import plan_products

    config = load_config(qwen_target)
    cfg = RunnerConfig(model_dir=qwen_target, device="cuda", dtype="bfloat16", num_slots=2, max_seq_len=64,
                       attention="triton", cuda_graphs=False, few_row_cuda=False)

    def runner(route: bool) -> ModelRunner:
        weights = load_weights(qwen_target, config, dtype="bfloat16", device="cuda")
        model = Transformer(config, weights, max_seq_len=64, attention="triton", int8_weights=int8)
        if route:
            projections = {name: [(getattr(layer, name), getattr(layer, f"{name}_bias", None))
                                  for layer in weights.layers] for name in ("qkv", "o", "gate_up", "down")}
            model.linear = plan_products(load_skinny_gemm(torch.device("cuda")), model.linear, projections,
                                         min_gain=-1.0)
            assert len(model.linear.plans) == 4 * len(ROW_BUCKETS)
        return ModelRunner(cfg, model=model)

    plain, routed = runner(False), runner(True)
    prompt = tuple(range(3, 40))  # 36 prefill rows: the fallback; each decode step: 1 row, the kernel
    tokens = {}
    for name, r in (("plain", plain), ("routed", routed)):
        r.add([AddSequence(0, prompt)])
        state, out, logits = r.get(0), [], []
        for _ in range(6):
            step = r.forward([(state, [])], [1])
            logits.append(step.float())
            out.append(int(step[-1].argmax()))
            r.commit(state, [out[-1]])
        tokens[name] = (out, torch.stack(logits))
    torch.testing.assert_close(tokens["routed"][1], tokens["plain"][1], rtol=5e-2, atol=5e-2)
    assert tokens["routed"][0] == tokens["plain"][0]


@gpu
@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16])
def test_fused_epilogues_equal_their_unfused_parts(kernel, int8, rows):
    """The norm (rows scaled by 1 / rms of their x), the residual add (in place) and the paired
    SiLU * up, for every launch shape a plan may pick, against fp32 of the same weights."""
    from bass.engine.fused_layers import pair_gate_up
    from bass.kernels.triton_int8 import Int8Weight

    cols, inner, eps = 1024, 896, 1e-6
    gen = torch.Generator(device="cuda").manual_seed(rows)
    halves = (torch.randn(cols, inner, device="cuda", generator=gen) / inner ** 0.5).bfloat16()
    plain = Int8Weight.quantize(halves) if int8 else None
    paired = Int8Weight.quantize(pair_gate_up(halves)) if int8 else None
    w, wp = (plain.q, paired.q) if int8 else (halves, pair_gate_up(halves))
    scale, scale_p = (plain.scale, paired.scale) if int8 else (None, None)
    reference_w = plain.dequantized() if int8 else halves.float()
    x = (3 * torch.randn(rows, inner, device="cuda", generator=gen)).bfloat16()
    bias = torch.randn(cols, device="cuda", generator=gen).bfloat16()
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    want_norm = normed @ reference_w.T + bias.float()
    gate, up = (normed @ reference_w.T).chunk(2, dim=-1)
    want_silu = F.silu(gate) * up
    residual = torch.randn(rows, cols, device="cuda", generator=gen).bfloat16()
    want_residual = x.float() @ reference_w.T + residual.float()
    split = SplitScratch(torch.device("cuda"))
    for groups in (1, 2):
        for warps in (4, 16):
            for per_sm, ways in ((0, 1), (1, 1), (0, 2), (0, 4)):
                launch = Launch(row_groups_for(rows), groups, warps, per_sm, ways)
                if not launch.fits() or not split.holds(launch, cols):
                    continue
                out = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
                kernel(x, w, scale, bias, out, launch, split, norm_eps=eps)
                torch.testing.assert_close(out.float(), want_norm, rtol=2e-2, atol=2e-2, msg=f"norm {launch}")
                act = torch.empty(rows, cols // 2, device="cuda", dtype=torch.bfloat16)
                kernel(x, wp, scale_p, None, act, launch, split, norm_eps=eps, silu_pairs=True)
                torch.testing.assert_close(act.float(), want_silu, rtol=2e-2, atol=2e-2, msg=f"silu {launch}")
                stream = residual.clone()
                kernel(x, w, scale, None, stream, launch, split, residual=stream)  # in place, as a layer runs it
                torch.testing.assert_close(stream.float(), want_residual, rtol=2e-2, atol=5e-2, msg=f"residual {launch}")
                assert int(split.arrivals.count_nonzero()) == 0


@gpu
def test_a_fused_draft_decodes_as_its_unfused_layers(qwen_wide_heads):
    """An int8 model with the kernel builds its decode layers fused (engine/fused_layers.py); its
    steps of 1-16 tokens give the logits of the same (prepared) weights on the unfused path,
    bf16 rounding apart, and the same greedy tokens; steps of more tokens run unfused."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.model import Transformer
    from bass.engine.runner import ModelRunner
    from bass.engine.weights import load_config, load_weights

    config = load_config(qwen_wide_heads)
    cfg = RunnerConfig(model_dir=qwen_wide_heads, device="cuda", dtype="bfloat16", num_slots=2, max_seq_len=64,
                       attention="triton", cuda_graphs=False, few_row_cuda=False)
    model = Transformer(config, load_weights(qwen_wide_heads, config, dtype="bfloat16", device="cuda"), max_seq_len=64,
                        attention="triton", int8_weights=True, few_row_cuda=True)
    assert model.fused_layers
    runner = ModelRunner(cfg, model=model)
    prompt = tuple(range(3, 40))
    tokens = {}
    for fused in (True, False):
        model.fused_layers = fused
        runner.add([AddSequence(int(fused), prompt)])
        state, out, logits = runner.get(int(fused)), [], []
        for _ in range(6):
            step = runner.forward([(state, [])], [1])
            logits.append(step.float())
            out.append(int(step[-1].argmax()))
            runner.commit(state, [out[-1]])
        tokens[fused] = (out, torch.stack(logits))
    torch.testing.assert_close(tokens[True][1], tokens[False][1], rtol=5e-2, atol=5e-2)
    assert tokens[True][0] == tokens[False][0]


def _decode_three_prompts(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight steps of three sequences (every fourth shaped like a verification of 3 tokens): the
    logits, and the first layer's cache entries of the three slots."""
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner

    runner = ModelRunner(cfg)
    if cfg.few_row_cuda:
        assert runner.model.fused_layers and runner.model.linear.kernel.programmatic is cfg.programmatic_launch
    runner.model.time_layer_paths = False  # the 12-row steps run the fused layers in both builds
    runner.warm_up(graph_shapes=[(1, 1), (3, 3)])
    runner.add([AddSequence(i, tuple(range(3 + i, 20 + 9 * i))) for i in range(3)])
    states, logits = [runner.get(i) for i in range(3)], []
    for step in range(8):
        q = 3 if step % 4 == 3 else 1
        for s in states:
            runner.rewind(s, 1)  # a token to run even where a draft token happened to be committed
        out = runner.forward([(s, [5] * (q - 1)) for s in states], [q] * 3)
        logits.append(out.float().cpu())
        for i, s in enumerate(states):
            runner.commit(s, [int(out[(i + 1) * q - 1].argmax())])
    return torch.cat(logits), runner.cache.k[0][[s.slot for s in states]].float().cpu()


@gpu
@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs sm_90 or newer")
@pytest.mark.parametrize("draft", [True, False], ids=["fused-int8-draft", "bf16-target"])
def test_programmatic_launches_give_the_bits_of_serial_ones(qwen_wide_heads, draft):
    """A kernel that starts before the one it follows has finished must still read that kernel's
    outputs (the activations, the cache entries, the residual it updated in place): decode and
    verification-shaped steps through CUDA graphs, after three prompts' prefill, give the same
    logits and cache bit for bit with programmatic dependent launch on and off."""
    from bass.core.config import RunnerConfig

    results = {}
    for programmatic in (True, False):
        cfg = RunnerConfig(model_dir=qwen_wide_heads, device="cuda", dtype="bfloat16", num_slots=3, max_seq_len=96,
                           attention="triton", cuda_graphs=True, int8_weights=draft, few_row_cuda=draft,
                           programmatic_launch=programmatic)
        with torch.inference_mode():
            results[programmatic] = _decode_three_prompts(cfg)
    assert torch.equal(results[True][0], results[False][0])
    assert torch.equal(results[True][1], results[False][1])


@gpu
@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 16])
def test_rotary_epilogue_writes_the_queries_and_cache_entries_of_the_unfused_step(kernel, int8, rows):
    """A q|k|v product with its heads' rotary halves paired (the draft's shape: 14 query and 2
    key/value heads of 64 dims) writes, through the norm and rope epilogue, the queries and KV
    cache entries that the product, RoPE and cache write give unfused; nothing else in the cache."""
    from bass.engine.fused_layers import pair_rope_heads
    from bass.kernels.cuda_skinny import Rope
    from bass.kernels.elementwise import rope_into_cache_reference, rope_pair_order
    from bass.kernels.triton_int8 import Int8Weight

    heads, kv_heads, dim, inner, slots, max_len, eps = 14, 2, 64, 896, 3, 40, 1e-6
    cols = (heads + 2 * kv_heads) * dim
    gen = torch.Generator(device="cuda").manual_seed(rows)
    natural = (torch.randn(cols, inner, device="cuda", generator=gen) / inner ** 0.5).bfloat16()
    bias = torch.randn(cols, device="cuda", generator=gen).bfloat16()
    paired = pair_rope_heads(natural, heads, kv_heads, dim)
    weight = Int8Weight.quantize(paired) if int8 else None
    # What the kernel multiplies by, back in the natural order (int8: the dequantized rows).
    rotated = (heads + kv_heads) * dim
    computed = weight.dequantized() if int8 else paired.float()
    natural_rows = torch.empty_like(computed[:rotated].unflatten(0, (-1, dim)))
    natural_rows[:, rope_pair_order(dim).cuda()] = computed[:rotated].unflatten(0, (-1, dim))
    reference_w = torch.cat((natural_rows.flatten(0, 1), computed[rotated:]))
    if not int8:
        assert torch.equal(reference_w, natural.float())
    x = (3 * torch.randn(rows, inner, device="cuda", generator=gen)).bfloat16()
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    qkv = (normed @ reference_w.T + bias.float()).bfloat16()
    angles = torch.rand(max_len, dim // 2, device="cuda", generator=gen) * 6
    cos, sin = (torch.cat([f(angles)] * 2, -1).bfloat16() for f in (torch.cos, torch.sin))
    token_slots = torch.randint(0, slots, (rows,), device="cuda", generator=gen)
    positions = torch.randperm(max_len, device="cuda", generator=gen)[:rows]  # no two rows share an entry
    caches = [torch.zeros(slots, max_len, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    want_q = rope_into_cache_reference(qkv, cos[positions], sin[positions], caches[0], caches[1], token_slots,
                                       positions, heads, kv_heads)
    split = SplitScratch(torch.device("cuda"))
    for launch in (Launch(row_groups_for(rows), 1, 4), Launch(row_groups_for(rows), 2, 8, 1),
                   Launch(row_groups_for(rows), 1, 4, 0, 2)):
        for c in caches[2:]:
            c.zero_()
        q = torch.full((rows, heads, dim), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = kernel(x, weight.q if int8 else paired, weight.scale if int8 else None,
                     pair_rope_heads(bias, heads, kv_heads, dim), torch.empty(0, device="cuda", dtype=torch.bfloat16),
                     launch, split, norm_eps=eps, rope=Rope(cos, sin, positions, token_slots, q, caches[2], caches[3]))
        assert out is q
        torch.testing.assert_close(q.float(), want_q.float(), rtol=3e-2, atol=3e-2, msg=f"q {launch}")
        torch.testing.assert_close(caches[2].float(), caches[0].float(), rtol=3e-2, atol=3e-2, msg=f"k {launch}")
        torch.testing.assert_close(caches[3].float(), caches[1].float(), rtol=3e-2, atol=3e-2, msg=f"v {launch}")
        written = torch.zeros(slots, max_len, dtype=torch.bool, device="cuda")
        written[token_slots, positions] = True
        assert not caches[2][~written].any() and not caches[3][~written].any()  # nothing else in the cache


@gpu
@pytest.mark.parametrize("int8", [True, False], ids=["int8-draft", "bf16-target"])
def test_steps_of_the_second_row_group_keep_the_layer_path_that_timed_faster(qwen_wide_heads, int8):
    """At capture, a step of 9-16 tokens is recorded through the fused layers and through the
    folded ones and timed (engine/graphs.py): the faster kept, what was timed reported, and the
    kept graph gives the logits of that path run eagerly; a step of 1-8 tokens is not timed."""
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.graphs import LAYER_PATH_MARGIN
    from bass.engine.runner import ModelRunner
    from bass.kernels.batch import RaggedBatch

    cfg = RunnerConfig(model_dir=qwen_wide_heads, device="cuda", dtype="bfloat16", num_slots=4, max_seq_len=96,
                       attention="triton", cuda_graphs=True, int8_weights=int8, few_row_cuda=True)
    with torch.inference_mode():
        runner = ModelRunner(cfg)
        assert runner.model.fused_layers
        runner.warm_up(graph_shapes=[(1, 1), (3, 3)])
        timed = {(t.bucket, t.q): t for t in runner.graphs.layer_path_timings}
        assert set(timed) == {(4, 3)}  # 4 x 3 = 12 tokens; (1, 1) steps and (3, 3) at 1-2 sequences are of 1-8
        kept = timed[(4, 3)]
        assert kept.fused_us > 0 and kept.folded_us > 0
        assert kept.fused == (kept.folded_us >= (1 - LAYER_PATH_MARGIN) * kept.fused_us)
        runner.add([AddSequence(i, tuple(range(3 + i, 20 + 5 * i))) for i in range(3)])
        states = [runner.get(i) for i in range(3)]
        cached = [runner.cached(s) for s in states]
        graphed = runner.forward([(s, [5, 6]) for s in states], [3] * 3).float()
        for s, n in zip(states, cached):
            runner.cache.truncate(s.slot, n)
        chunks = runner.stage([(s, [5, 6]) for s in states], [3] * 3)
        eager = runner.model.logits(runner.model.hidden(RaggedBatch.build(chunks, runner.device), runner.cache,
                                                        fused=kept.fused)).float()
    torch.testing.assert_close(graphed, eager, rtol=2e-2, atol=2e-2)
