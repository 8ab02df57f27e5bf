"""The batch-invariant mode: a linear layer whose rows do not depend on the rows around them
(Triton, interpreter on the CPU), and the model and services that use it for the target."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.coordinator.requests import GenerationRequest  # noqa: E402
from bass.core.config import RunnerConfig, SamplingParams, WorkerServiceConfig  # noqa: E402
from bass.kernels.triton_matmul import InvariantLinear, splits_for  # noqa: E402
from conftest import build_scheduler  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
linear_invariant = InvariantLinear(DEVICE)


@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear(with_bias):
    torch.manual_seed(0)
    x, w = torch.randn(37, 130), torch.randn(70, 130)
    bias = torch.randn(70) if with_bias else None
    want = torch.nn.functional.linear(x, w, bias)
    if DEVICE == "cuda":  # bf16 operands, as served; the interpreter checks exact fp32 sums
        x, w, bias = (t if t is None else t.to(DEVICE, torch.bfloat16) for t in (x, w, bias))
    got = linear_invariant(x, w, bias).float().cpu()
    tolerance = 3e-2 if DEVICE == "cuda" else 1e-4
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * 10)
    assert linear_invariant(x.view(37, 1, 130), w, bias).shape == (37, 1, 70)


@pytest.mark.parametrize("cols, inner", [(96, 256), (16384, 256), (40, 4200)])  # narrow, wide, split K
def test_a_row_is_the_same_in_any_batch(cols, inner, row_exact_interpreter_dot):
    torch.manual_seed(1)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x, w = torch.randn(70, inner, device=DEVICE).to(dtype), torch.randn(cols, inner, device=DEVICE).to(dtype)
    full = linear_invariant(x, w)
    for rows in (slice(5, 6), slice(0, 8), slice(3, 40), slice(64, 70)):
        assert torch.equal(linear_invariant(x[rows], w), full[rows])
    if splits_for(inner) > 1:  # the split K's arrival counters are left zeroed for the next call
        assert not linear_invariant.arrivals.any()
        torch.testing.assert_close(full.float(), torch.nn.functional.linear(x.float(), w.float()),
                                   rtol=3e-2 if DEVICE == "cuda" else 1e-4, atol=0.5 if DEVICE == "cuda" else 1e-3)


@pytest.mark.skipif(DEVICE != "cuda", reason="cuBLAS's shape-dependent choices: GPU")
def test_rows_are_invariant_where_cublas_is_not_bf16_real_shapes():
    """At the 1.5B's MLP shape, bf16: the kernel's rows at batch 1, 8, 40 and 320 are bitwise
    those of the whole batch, and close to F.linear."""
    torch.manual_seed(2)
    x = torch.randn(320, 1536, device="cuda").to(torch.bfloat16)
    w = (torch.randn(8960, 1536, device="cuda") * 0.02).to(torch.bfloat16)
    full = linear_invariant(x, w)
    for rows in (1, 8, 40):
        assert torch.equal(linear_invariant(x[:rows], w), full[:rows])
    ref = torch.nn.functional.linear(x.float(), w.float())
    assert ((full.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_the_service_config_carries_the_mode(tmp_path):
    cfg = WorkerServiceConfig(model_dir=tmp_path, device="cpu", dtype="float32", batch_invariant=True)
    assert cfg.runner_config().batch_invariant
    assert not WorkerServiceConfig(model_dir=tmp_path, device="cpu", dtype="float32").runner_config().batch_invariant


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU (interpreter) check; test_gpu.py runs the mode in bf16")
def test_model_output_is_unchanged_by_the_mode(llama_target, llama_draft):
    """Greedy and seeded sampled tokens with the target in batch-invariant mode equal those of
    the default mode (fp32 on the CPU, where both compute the same sums), speculative and regular."""
    requests = [GenerationRequest(prompt_ids=(5, 17, 33, 200), max_new_tokens=10, ignore_eos=True),
                GenerationRequest(prompt_ids=(9, 4), n=2, max_new_tokens=10, seed=3, ignore_eos=True,
                                  sampling=SamplingParams(temperature=0.9, top_p=0.95))]
    plain = build_scheduler(llama_target, llama_draft, "3").generate(requests)
    invariant = build_scheduler(llama_target, llama_draft, "3", batch_invariant=True)
    assert isinstance(invariant.target.runner.model.linear, InvariantLinear)
    got = invariant.generate(requests)
    assert [[s.token_ids for s in r.sequences] for r in got] == [[s.token_ids for s in r.sequences] for r in plain]
    assert sum(r.stats.draft_tokens for r in got) > 0
    assert RunnerConfig(model_dir=llama_target).batch_invariant is False
