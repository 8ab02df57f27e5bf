"""The Triton Gumbel race against its PyTorch reference (sampling.race): interpreter on the CPU,
the real kernel on a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from bass.config import SamplingParams  # noqa: E402
from bass.engine.sampling import RowParams, noise_keys, race, truncation_cut  # noqa: E402
from bass.kernels.triton_sampling import gumbel_race, window_cut  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(), SamplingParams(temperature=1.0),
            SamplingParams(temperature=0.3, top_k=5), SamplingParams(temperature=1.3, top_k=40, top_p=0.5),
            SamplingParams(temperature=0.0, top_k=3)]


def kernel_inputs(logits, params, keys):
    # From the settings themselves: the engine never launches the kernel for all-greedy rows
    # (RowParams then holds no tensors), but these tests do.
    dev = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=dev)
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    truncating = ((top_k > 0) | (top_p < 1)) & ~greedy
    cut = torch.where(truncating, truncation_cut(logits.float() / temperature[:, None], top_k, top_p),
                      torch.full_like(temperature, float("-inf")))
    return temperature, cut, keys.to(logits.device), greedy


@pytest.mark.parametrize("vocab", [37, 5000, 9000])  # one partial block; several blocks
def test_kernel_picks_the_reference_winner(vocab):
    torch.manual_seed(vocab)
    params = SETTINGS * 2
    logits = torch.randn(len(params), vocab) * 3
    keys = noise_keys(range(100, 100 + len(params)), range(len(params)))
    want = race(logits, RowParams.build(params, "cpu"), keys)
    got = gumbel_race(logits.to(DEVICE), *kernel_inputs(logits.to(DEVICE), params, keys)).cpu()
    assert torch.equal(got, want)


def test_kernel_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    params = SETTINGS
    logits = (torch.randn(len(params), 5000) * 2).to(DEVICE)
    keys = noise_keys(range(len(params)), [3] * len(params))
    together = gumbel_race(logits, *kernel_inputs(logits, params, keys))
    for i in range(len(params)):
        alone = gumbel_race(logits[i:i + 1], *kernel_inputs(logits[i:i + 1], params[i:i + 1], keys[i:i + 1]))
        assert alone.item() == together[i].item()


@pytest.mark.parametrize("width", [37, 64, 256])
def test_window_cut_kernel_is_the_reference(width):
    """The one-launch cut over each row's window equals engine/sampling's PyTorch reference:
    top-k inside and beyond the window, top-p cuts at every depth, ties at the cut."""
    from bass.engine.sampling import _cut_in_window_reference

    gen = torch.Generator().manual_seed(width)
    rows = 24
    scaled = torch.randn(rows, 2000, generator=gen) * torch.linspace(0.5, 6, rows)[:, None]
    scaled[3, :10] = scaled[3].max() + 1  # ten tokens tied at the top
    top = scaled.topk(width, dim=-1).values
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    top_k = torch.tensor([0, 1, 5, width, width + 3, 0, 40, 0] * 3)
    top_p = torch.tensor([0.95, 1.0, 0.5, 0.99, 0.9, 0.3, 0.8, 1.0] * 3)
    want_cut, want_inside = _cut_in_window_reference(top, torch.exp(top - lse), top_k, top_p)
    cut, inside = window_cut(top.to(DEVICE), lse.to(DEVICE), top_k.to(DEVICE), top_p.to(DEVICE))
    assert torch.equal(inside.cpu(), want_inside)
    torch.testing.assert_close(cut.cpu(), want_cut, atol=0, rtol=0)
    assert want_inside.any() and not want_inside.all()  # both kinds of rows were checked


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 logits at the real vocabulary size: GPU")
def test_kernel_on_real_vocabulary_bf16():
    torch.manual_seed(1)
    params = SETTINGS * 8
    logits = (torch.randn(len(params), 151_936, device="cuda") * 4).to(torch.bfloat16)
    keys = noise_keys(range(len(params)), range(len(params)))
    got = race(logits, RowParams.build(params, "cuda"), keys.cuda()).cpu()  # dispatches to the kernel
    want = race(logits.float().cpu(), RowParams.build(params, "cpu"), keys)
    # The noise's float transform may round differently on the GPU: only near-ties can differ.
    assert (got == want).float().mean() >= 0.97
