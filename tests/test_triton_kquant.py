"""Products straight from GGUF k-quant blocks (kernels/triton_kquant.py): the planes decode to gguf's
own dequantization bit for bit, and the kernel multiplies by exactly the bf16 weight the converted
checkpoint holds (interpreter on the CPU, the real kernel on the GPU)."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
gguf = pytest.importorskip("gguf")

from bass.kernels import triton_kquant as kq  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORMATS = ("Q4_K", "Q6_K")


def random_blocks(fmt: str, rows: int, inner: int, seed: int = 0) -> np.ndarray:
    return kq.random_gguf_blocks(fmt, rows, inner, torch.Generator().manual_seed(seed)).numpy()


def weight(fmt: str, rows: int, inner: int, seed: int = 0) -> kq.KQuantWeight:
    raw = torch.from_numpy(random_blocks(fmt, rows, inner, seed)).to(DEVICE)
    return kq.KQuantWeight.from_gguf_blocks(fmt, raw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_planes_decode_to_ggufs_own_dequantization_bit_for_bit(fmt):
    raw = random_blocks(fmt, 24, 768, seed=3)
    want = gguf.dequantize(raw, getattr(gguf.GGMLQuantizationType, fmt)).reshape(24, 768)
    w = kq.KQuantWeight.from_gguf_blocks(fmt, torch.from_numpy(raw))
    got = kq.dequantize_planes(fmt, w.planes)
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want)
    assert torch.equal(w.full, torch.from_numpy(want).bfloat16())  # the converter's rounding


def test_unknown_formats_and_partial_blocks_are_refused():
    raw = torch.zeros(4, kq.Q4_K_BLOCK_BYTES, dtype=torch.uint8)
    with pytest.raises(ValueError, match="Q5_K"):
        kq.KQuantWeight.from_gguf_blocks("Q5_K", raw)
    with pytest.raises(ValueError, match="a multiple of 144 bytes"):
        kq.KQuantWeight.from_gguf_blocks("Q4_K", raw[:, :100])


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_kernel_multiplies_by_the_converted_bf16_weight_exactly(fmt):
    """One-hot rows pick single inputs, so the output is the weight the kernel rebuilt in registers:
    it must be the converter's bf16 value, bit for bit (the GPU's cast rounds to nearest even)."""
    w = weight(fmt, 40, 512, seed=4)
    picks = torch.tensor([0, 1, 15, 16, 31, 32, 33, 63, 64, 100, 255, 256, 300, 400, 480, 511])
    x = torch.zeros(16, 512, dtype=torch.bfloat16, device=DEVICE)
    x[torch.arange(16), picks.to(DEVICE)] = 1
    got = kq.KQuantLinear(torch.device(DEVICE))(x, w, out_dtype=torch.float32)
    assert torch.equal(got, w.full.float()[:, picks.to(DEVICE)].T)


# (rows, output columns, inner size): the few- and many-column tilings with a ragged last column
# block, two row blocks, the split K (inner >= 4096) with a ragged last split, alone and over
# three row blocks, and rows past max_rows (cuBLAS on the bf16 weight).
@pytest.mark.parametrize("rows,cols,inner", [(1, 40, 256), (5, 4100, 256), (17, 48, 512), (3, 40, 4352),
                                             (33, 24, 4352), (kq.MAX_KQUANT_ROWS + 1, 24, 256)])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("with_bias,fit_row_block", [(False, False), (True, False), (False, True)])
def test_kquant_linear_is_the_product_with_the_bf16_weight(fmt, rows, cols, inner, with_bias, fit_row_block):
    torch.manual_seed(1)
    w = weight(fmt, cols, inner, seed=rows)
    x = torch.randn(rows, inner, device=DEVICE).bfloat16()
    bias = torch.randn(cols, device=DEVICE).bfloat16() if with_bias else None  # the model's dtype
    linear = kq.KQuantLinear(torch.device(DEVICE), fit_row_block=fit_row_block)
    got = linear(x, w, bias, out_dtype=torch.float32)
    want = F.linear(x.double(), w.full.double(), None if bias is None else bias.double()).float()
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    tolerance = 2e-4 if rows <= linear.max_rows else 1e-2  # cuBLAS rounds its output to bf16
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    assert int(linear.arrivals.count_nonzero()) == 0  # split-K counters left zeroed for the next call


@pytest.mark.skipif(DEVICE != "cuda", reason="the interpreter's dot is NumPy's matmul, whose sums vary by shape")
def test_a_rows_result_does_not_depend_on_the_rest_of_the_batch():
    """The launch shape depends on the weight only, and each sum runs in a fixed order: a row gets
    the same bits alone, among 16 and among 40 (seeds that hold), and a call repeats exactly."""
    w = weight("Q4_K", 48, 4352, seed=5)
    linear = kq.KQuantLinear(torch.device(DEVICE))
    torch.manual_seed(2)
    batch = torch.randn(40, 4352, device=DEVICE).bfloat16()
    alone = linear(batch[7:8], w, out_dtype=torch.float32)
    assert torch.equal(alone[0], linear(batch[:16], w, out_dtype=torch.float32)[7])
    assert torch.equal(alone[0], linear(batch, w, out_dtype=torch.float32)[7])
    assert torch.equal(alone, linear(batch[7:8], w, out_dtype=torch.float32))


def test_the_product_lands_in_a_column_slice_of_a_wider_output():
    """q|k|v of one layer can mix formats (v is Q6_K in half the layers): each part writes its own
    columns of one output."""
    q4, q6 = weight("Q4_K", 40, 256, seed=6), weight("Q6_K", 24, 256, seed=7)
    x = torch.randn(3, 256, device=DEVICE).bfloat16()
    linear = kq.KQuantLinear(torch.device(DEVICE))
    out = torch.full((3, 64), float("nan"), device=DEVICE)
    linear(x, q4, out=out[:, :40])
    linear(x, q6, out=out[:, 40:])
    want = F.linear(x.double(), torch.cat([q4.full, q6.full]).double()).float()
    torch.testing.assert_close(out, want, atol=2e-4, rtol=2e-4)
    with pytest.raises(ValueError, match="unit column stride"):
        linear(x, q4, out=torch.empty(40, 3, device=DEVICE).T)
