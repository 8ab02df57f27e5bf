"""Decode attention from CUDA C++ (kernels/cuda/decode_attention.cu): one query token a sequence,
for the steps a draft proposes in, in the kernel library (kernels/cuda_library.py).

Same signature as the other attention kernels (kernels/attention.py) for the batches it takes:
every sequence one token (a decode step), heads of 64 or 128 dims, at most 8 query heads a KV
head, bf16. Launched on PyTorch's current stream: CUDA graphs capture it, and the number of
key splits is sized on the device from each sequence's context, so a captured launch serves
every context up to the bound it was captured with.
"""

from __future__ import annotations

import ctypes

import torch

from bass.kernels.batch import RaggedBatch
from bass.kernels.cuda_library import load_for_device

KEYS_PER_BLOCK = 128  # the kernel's chunk of keys, one a thread
MAX_SPLITS = 16  # blocks a sequence's keys may be split over
MAX_GROUP = 8  # query heads a KV head serves
HEAD_DIMS = (64, 128)


class DecodeAttention:
    """attend(q [B, heads, D], k_cache, v_cache [slots, positions, kv_heads, D], batch, scale)
    -> [B, heads, D], for a batch of one token a sequence."""

    def __init__(self, library: ctypes.CDLL, device: torch.device, arrival_counters: int = 4096):
        self._fn = library.bass_decode_attention
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = ([ctypes.c_void_p] * 9 + [ctypes.c_int] * 4 + [ctypes.c_int64] * 2
                             + [ctypes.c_float, ctypes.c_int, ctypes.c_void_p])
        # Zero between calls (the kernel leaves them zeroed): one buffer for every layer and step.
        self.arrivals = torch.zeros(arrival_counters, dtype=torch.int32, device=device)

    @staticmethod
    def takes(batch: RaggedBatch, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
        return (batch.max_q == 1 and dtype == torch.bfloat16 and head_dim in HEAD_DIMS
                and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP)

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: RaggedBatch,
                 scale: float) -> torch.Tensor:
        tokens, heads, head_dim = q.shape
        kv_heads = k_cache.shape[2]
        if tokens != batch.num_seqs or not self.takes(batch, heads, kv_heads, head_dim, q.dtype):
            raise ValueError(f"decode attention takes one bf16 token a sequence, heads of {HEAD_DIMS} dims and "
                             f"<= {MAX_GROUP} query heads a KV head; got {tokens} tokens for {batch.num_seqs} "
                             f"sequences, {heads}/{kv_heads} heads of {head_dim}, {q.dtype}")
        if not (q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("decode attention reads contiguous q and caches")
        splits = max(1, min(MAX_SPLITS, -(-batch.max_ctx // KEYS_PER_BLOCK)))  # the host's bound; the device sizes each
        pairs = tokens * kv_heads
        if splits > 1 and pairs > self.arrivals.numel():
            raise ValueError(f"{pairs} (sequence, KV head) pairs: more than the {self.arrivals.numel()} counters")
        out = torch.empty_like(q)
        partial_o = partial_ml = None
        if splits > 1:
            partial_o = torch.empty(pairs * splits * MAX_GROUP * head_dim, dtype=torch.float32, device=q.device)
            partial_ml = torch.empty(pairs * splits * MAX_GROUP * 2, dtype=torch.float32, device=q.device)
        err = self._fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), batch.slots.data_ptr(),
                       batch.ctx_lens.data_ptr(), out.data_ptr(),
                       partial_o.data_ptr() if partial_o is not None else None,
                       partial_ml.data_ptr() if partial_ml is not None else None,
                       self.arrivals.data_ptr() if splits > 1 else None, tokens, heads, kv_heads, head_dim,
                       k_cache.stride(0), k_cache.stride(1), float(scale), splits,
                       torch.cuda.current_stream(q.device).cuda_stream)
        if err:
            raise RuntimeError(f"decode attention launch failed (cudaError {err}): {tokens} sequences, "
                               f"{heads}/{kv_heads} heads of {head_dim}, {splits} splits")
        return out


def load_decode_attention(device: torch.device) -> DecodeAttention | None:
    library = load_for_device(device, "decode attention stays on Triton")
    return DecodeAttention(library, device) if library is not None else None
