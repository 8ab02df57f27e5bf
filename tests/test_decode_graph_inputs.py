"""The static inputs a captured decode step reads (engine/graphs.StaticInputs): what a fill
leaves in them, on any device (the graphs themselves run on a GPU only)."""

from __future__ import annotations

import pytest
import torch

from bass.engine.graphs import StaticInputs
from bass.kernels.batch import RaggedBatch, SequenceChunk


@pytest.mark.parametrize("bucket,q", [(4, 3), (1, 1), (2, 5)])
def test_a_fill_is_the_plain_batch_padded_with_scratch_sequences(bucket, q):
    scratch = 9
    inputs = StaticInputs(bucket, q, rows=q, scratch_slot=scratch, max_len=64, device=torch.device("cpu"))
    for round_ in range(2):  # a second fill leaves nothing of the first
        chunks = [SequenceChunk(slot=s, start=10 * s + round_, tokens=[100 * s + j + round_ for j in range(q)],
                                logit_rows=q) for s in range(max(1, bucket - 1))]
        inputs.fill(chunks)
        padding = [SequenceChunk(slot=scratch, start=0, tokens=[0] * q, logit_rows=q)] * (bucket - len(chunks))
        want = RaggedBatch.build(chunks + padding, "cpu")
        for name in ("input_ids", "positions", "token_slots", "slots", "ctx_lens"):
            assert getattr(inputs.batch, name).tolist() == getattr(want, name).tolist(), name


def test_the_step_vectors_are_the_staging_buffer_itself_each_on_a_16_byte_boundary():
    """A fill is one copy into the buffer the graph reads: no vector is a buffer of its own."""
    inputs = StaticInputs(1, 3, rows=3, scratch_slot=0, max_len=64, device=torch.device("cpu"))
    device = inputs.staging.device
    start, end = device.data_ptr(), device.data_ptr() + device.numel() * device.element_size()
    for name in ("input_ids", "positions", "token_slots", "slots", "ctx_lens"):
        view = getattr(inputs.batch, name)
        assert view.is_contiguous() and start <= view.data_ptr() < end, name
        assert (view.data_ptr() - start) % 16 == 0, name
    assert inputs.batch.ctx_lens_are_bounds and inputs.batch.max_ctx == 64
