"""The draft's fused few-row kernels (kernels/triton_skinny.py) against their references, and a
draft running them: the same greedy text as the target alone (interpreter on the CPU)."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.kernels.elementwise import add_rms_norm_reference, silu_mul_reference  # noqa: E402
from bass.kernels.triton_skinny import MAX_SKINNY_ROWS, Tiling, norm_linear, skinny_linear  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# Tilings whose blocks do not divide the shapes below (masks on every edge) and one that does.
TILINGS = [Tiling(32, 32, 4, 2), Tiling(16, 64, 2, 3)]


def close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    else:  # other summation order than cuBLAS: a few units in the last place
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 16, 24])
@pytest.mark.parametrize("tiling", TILINGS)
def test_norm_linear_matches_norm_then_linear(dtype, rows, tiling):
    torch.manual_seed(rows)
    inner, cols = 96, 80
    x = torch.randn(rows, inner, device=DEVICE).to(dtype)
    res = torch.randn(rows, inner, device=DEVICE).to(dtype)
    g = (1 + 0.1 * torch.randn(inner, device=DEVICE)).to(dtype)
    w = (0.1 * torch.randn(2 * cols, inner, device=DEVICE)).to(dtype)
    b = torch.randn(2 * cols, device=DEVICE).to(dtype)
    h, summed_ref = add_rms_norm_reference(x, res, g, 1e-6)
    out, summed = norm_linear(x, res, g, 1e-6, w, b, tiling=tiling)
    close(out, F.linear(h, w, b), dtype)
    assert torch.equal(summed, summed_ref)  # the residual stream is rounded where the reference rounds
    out, _ = norm_linear(x, res, g, 1e-6, w, None, silu=True, tiling=tiling)
    close(out, silu_mul_reference(F.linear(h, w)), dtype)
    h0, _ = add_rms_norm_reference(x, None, g, 1e-6)
    out, summed = norm_linear(x, None, g, 1e-6, w, b, tiling=tiling)
    close(out, F.linear(h0, w, b), dtype)
    assert summed is x
    close(skinny_linear(x, w, b, tiling=tiling), F.linear(x, w, b), dtype)


def test_too_many_rows_is_refused():
    x = torch.zeros(MAX_SKINNY_ROWS + 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        skinny_linear(x, torch.zeros(8, 16, device=DEVICE))


def _runner(model_dir, **extra):
    from bass.config import RunnerConfig
    from bass.engine.runner import ModelRunner

    return ModelRunner(RunnerConfig(model_dir=model_dir, device=DEVICE, num_slots=4, max_seq_len=64,
                                    attention="triton", cuda_graphs=False, **extra))


def test_fused_forward_matches_the_unfused_one(qwen_target):
    """Few tokens take the fused path, more the unfused one; both give the same logits (fp32)."""
    from bass.worker_api import AddSequence

    ids = [5, 17, 33, 200, 7, 9, 11, 40, 41]
    logits = {}
    for fused in (0, 32):
        runner = _runner(qwen_target)
        assert runner.model.fuse_few_rows(fused) == fused
        runner.add([AddSequence(1, tuple(ids[:4])), AddSequence(2, tuple(ids[:2]))])
        s1, s2 = runner.get(1), runner.get(2)
        runner.commit(s1, ids[4:6])
        runner.commit(s2, ids[2:5])
        logits[fused] = runner.forward([(s1, [50]), (s2, [])], [3, 4]).cpu()
    torch.testing.assert_close(logits[32], logits[0], atol=1e-4, rtol=1e-4)


def test_fusing_is_off_without_the_triton_kernels(qwen_target):
    from bass.config import RunnerConfig
    from bass.engine.runner import ModelRunner

    runner = ModelRunner(RunnerConfig(model_dir=qwen_target, num_slots=2, max_seq_len=64, attention="pad"))
    assert runner.model.fuse_few_rows(32) == 0
    assert _runner(qwen_target, batch_invariant=True).model.fuse_few_rows(32) == 0 if DEVICE == "cuda" else True


def test_a_fused_draft_keeps_greedy_output_exact(llama_target, llama_draft):
    """The fused kernels change only how the draft rounds: the text must stay the target's."""
    from bass.config import DraftLengthConfig, RunnerConfig, SchedulerConfig
    from bass.coordinator.requests import GenerationRequest
    from bass.coordinator.scheduler import Scheduler
    from bass.coordinator.tokenizer import load_codec
    from bass.local import build_local_workers

    def cfg(d):
        return RunnerConfig(model_dir=d, device=DEVICE, num_slots=4, max_seq_len=128, attention="triton",
                            cuda_graphs=False)

    def tokens(target, draft):
        scheduler = Scheduler(target, draft, load_codec(llama_target),
                              SchedulerConfig(draft_length=DraftLengthConfig.parse("4")))
        requests = [GenerationRequest(prompt=p, max_new_tokens=24, ignore_eos=True) for p in ("def fib", "for i in")]
        return [r.sequences[0].token_ids for r in scheduler.generate(requests)], scheduler.step_stats

    target, draft = build_local_workers(cfg(llama_target), cfg(llama_draft), draft_fused_rows=32)
    assert draft.fused_rows == 32
    fused, stats = tokens(target, draft)
    regular, _ = tokens(target, None)
    assert fused == regular
    assert stats.draft_tokens > 0  # it did speculate
