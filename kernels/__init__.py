"""Attention over ragged batches and the KV cache.

Every kernel has one signature, `attend(q, k_cache, v_cache, batch, scale) -> out`, with
q / out packed as [tokens, heads, head_dim] and the caches as [slots, max_seq_len, kv_heads,
head_dim] (one layer). `pad` and `split` are BASS's two baselines written in PyTorch; they are
also the references that faster kernels are tested against.
"""

from bass.kernels.attention import ATTENTION_KERNELS, attention_kernel

__all__ = ["ATTENTION_KERNELS", "attention_kernel"]
