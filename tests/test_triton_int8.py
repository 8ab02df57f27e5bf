"""Weight-only int8 products (kernels/triton_int8.py) against PyTorch (interpreter on the CPU),
and a draft built with int8 weights: its proposals change, the output does not."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.kernels.triton_int8 import MAX_INT8_ROWS, Int8Linear, Int8Weight  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_quantize_rounds_each_column_to_its_own_scale():
    torch.manual_seed(0)
    w = torch.randn(48, 80) * torch.linspace(0.01, 3, 48)[:, None]  # columns of very different size
    q = Int8Weight.quantize(w)
    assert q.q.dtype == torch.int8 and q.q.abs().max() == 127 and q.scale.shape == (48,)
    assert q.full is w
    # every entry within half a step of its column's scale
    assert bool(((q.dequantized() - w).abs() <= q.scale[:, None] / 2 + 1e-7).all())


# (rows, output columns, inner size): each tiling of _tiling, the split K (inner >= 4096) with a
# ragged last split, and a row count past MAX_INT8_ROWS (cuBLAS on the full weight, or two row
# blocks where the limit is raised).
@pytest.mark.parametrize("rows,cols,inner", [(1, 40, 96), (5, 4100, 64), (16, 70, 4160), (3, 66000, 16),
                                             (MAX_INT8_ROWS + 1, 40, 96)])
@pytest.mark.parametrize("max_rows", [MAX_INT8_ROWS, 40])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_linear_is_the_product_with_the_dequantized_weight(rows, cols, inner, with_bias, max_rows):
    torch.manual_seed(1)
    w = Int8Weight.quantize(torch.randn(cols, inner, device=DEVICE) / inner ** 0.5)
    x = torch.randn(rows, inner, device=DEVICE)
    bias = torch.randn(cols, device=DEVICE) if with_bias else None
    linear = Int8Linear(torch.device(DEVICE), max_rows=max_rows)  # 40: two row blocks of the kernel
    got = linear(x, w, bias)
    weight = w.full if rows > max_rows else w.dequantized()
    if DEVICE == "cuda" and rows <= max_rows:
        x = x.bfloat16().float()  # the tensor cores read the activations in bf16
    want = F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert int(linear.arrivals.count_nonzero()) == 0  # split-K counters left zeroed for the next call


def test_int8_linear_gives_fp32_when_asked_and_repeats_bit_for_bit():
    """The LM head's fp32 logits straight from the kernel; the split K sums its partials in a
    fixed order, so a call repeats exactly."""
    torch.manual_seed(2)
    w = Int8Weight.quantize(torch.randn(64, 4096, device=DEVICE).to(torch.bfloat16 if DEVICE == "cuda" else torch.float32))
    x = torch.randn(4, 4096, device=DEVICE).to(w.full.dtype)
    linear = Int8Linear(torch.device(DEVICE))
    first = linear(x, w, None, torch.float32)
    assert first.dtype == torch.float32
    assert torch.equal(first, linear(x, w, None, torch.float32))


def test_a_draft_with_int8_weights_leaves_the_output_the_targets(llama_target, llama_draft):
    """Lossless whatever the draft computes: greedy speculative text with an int8 draft equals
    regular decoding, and the int8 draft still proposes mostly what the full one does."""
    from bass.app.local import build_local_scheduler
    from bass.coordinator.requests import GenerationRequest
    from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig

    prompts = [(5, 17, 33), (42, 7), tuple(range(3, 20))]

    def run(policy, int8):
        cfg = dict(device=DEVICE, dtype="float32", num_slots=8, max_seq_len=128, attention="triton")
        s = build_local_scheduler(RunnerConfig(model_dir=llama_target, **cfg),
                                  RunnerConfig(model_dir=llama_draft, int8_weights=int8, **cfg),
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        out = s.generate([GenerationRequest(prompt_ids=p, max_new_tokens=12, ignore_eos=True) for p in prompts])
        return [r.sequences[0].token_ids for r in out], s

    regular, _ = run("0", False)
    full, s_full = run("3", False)
    int8, s_int8 = run("3", True)
    assert full == regular and int8 == regular
    assert s_int8.draft.runner.model.int8_weights and not s_full.draft.runner.model.int8_weights
    accepted = [s.step_stats.accepted_tokens / s.step_stats.draft_tokens for s in (s_full, s_int8)]
    assert accepted[1] > 0.5 * accepted[0] > 0
