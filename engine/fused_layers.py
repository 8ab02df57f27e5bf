"""A decoder layer in five launches: its four products carry the norms, RoPE and the KV
cache writes, the residual adds and SiLU * up in their epilogues (kernels/cuda/skinny_gemm.cu).

Why: at 1-16 rows every launch of the 0.5B draft costs ~1 µs of boundary on top of its work, and
the unfused layer runs nine (bench/results/journal/2026-11-27-draft-layers.md: 17% of its GPU
time in the elementwise kernels, another 17-20% between kernels). Fused, a layer is

    q, cache k, v = RoPE(rows_scaled(x @ (W_qkv * g_in).T) + b)
                                                      (the input RMSNorm: 1 / rms(x) a row; q
                                                       rotated, k rotated and v written into the cache)
    attention                                         (as before)
    x += attn @ W_o.T + b_o                           (in place)
    act = silu(gate) * up of rows_scaled(x @ (W_gate_up * g_post).T)
    x += act @ W_down.T                               (in place)

The earlier attempts at fusing this layer (Triton, retired) made each product slower by what they
saved; here the norm's sums of squares come from the activation words a product's lanes load
anyway, and the epilogue adds a few operations per output.

The weights are changed once at load, for every path of the model: the norms' weights folded
into the columns of q|k|v and gate|up (the norms become weightless), gate|up's rows interleaved
in groups of 8 gates and their 8 ups, so one lane of the product holds a gate and its up, and
each query and key head's rows in groups of 8 dims and their 8 rotation partners
(kernels/elementwise.rope_pair_order), so one lane holds both halves of a rotation. Steps of
more than 16 rows (prefill, catch-up, a verification of many sequences) compute the same function
from them in seven launches a layer (Transformer._folded_hidden): cuBLAS products of the un-normed
residual stream, each norm's 1 / rms applied by the RoPE or SiLU kernel after the product, and the
residual adds in the o and down GEMMs (beta = 1). On an H200 that made a k = 3 verification of 8
sequences 5-10% faster end to end (bench/results 2026-11-28-h200-folded-layers). A captured step
of 9-16 rows (the products' second 8-row group) takes whichever of the two paths timed faster at
capture (Transformer.layer_paths, engine/graphs.py). Rounding differs from transformers' (the norm's weight multiplies the weight,
rounded once to the model's dtype, not the normed activation; intermediate sums stay in fp32).
For a draft that decides only what it proposes. For a target (bf16; H100: a forward's GPU time
-15% at 1-8 sequences, bench/results 2026-11-27) it is the target's own function in every path;
but a step of more than 16 rows runs cuBLAS, which rounds differently from the kernel, so a
near-tied greedy token can differ between a regular step and a verification (RunnerConfig.few_row_cuda).
"""

from __future__ import annotations

import torch

from bass.kernels.cuda_skinny import MAX_NORM_ROWS, inner_multiple
from bass.kernels.elementwise import rope_pair_order

MAX_FUSED_ROWS = MAX_NORM_ROWS  # steps of more tokens run the unfused layer
PAIR = 8  # gate|up columns interleave in groups of 8 gates and their 8 ups


def pair_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """[2 I, H] with the gates' rows first -> rows in groups of 8 gates, then their 8 ups."""
    gate, up = gate_up.chunk(2, dim=0)
    rows = gate.shape[0]
    if rows % PAIR:
        raise ValueError(f"pairing gate|up needs an intermediate size divisible by {PAIR}, got {rows}")
    return torch.stack((gate.unflatten(0, (-1, PAIR)), up.unflatten(0, (-1, PAIR))), dim=1).flatten(0, 2).contiguous()


def fold_norm(weight: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """W * g over W's inputs: (x / rms(x) * g) @ W.T == (x / rms(x)) @ (W * g).T."""
    return (weight.float() * norm.float()[None, :]).to(weight.dtype)


def pair_rope_heads(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """q|k|v's rows (or bias) [(heads + 2 kv_heads) head_dim, ...] with each query and key head's
    rows in rope_pair_order; the values' rows as they were."""
    rotated = (heads + kv_heads) * head_dim
    order = rope_pair_order(head_dim).to(qkv.device)
    heads_rows = qkv[:rotated].unflatten(0, (-1, head_dim))[:, order].flatten(0, 1)
    return torch.cat((heads_rows, qkv[rotated:])).contiguous()


def can_fuse(config) -> bool:
    """Whether the kernel takes this model's layer: every product's inner size a whole number of
    the int8 kernel's chunks, gate|up pairable, heads of whole 16-column groups."""
    chunk = inner_multiple(weight_int8=True)
    inners = (config.hidden_size, config.num_heads * config.head_dim, config.intermediate_size)
    return (all(n % chunk == 0 for n in inners) and config.intermediate_size % PAIR == 0
            and config.head_dim % 16 == 0)


def prepare_weights(weights, config) -> None:
    """Fold every layer's norms into its projections, pair gate|up and the rotary halves of
    q|k|v, in place, before any quantization (TransformerWeights of bf16 tensors)."""
    c = config
    for layer in weights.layers:
        layer.qkv = pair_rope_heads(fold_norm(layer.qkv, layer.input_norm), c.num_heads, c.num_kv_heads, c.head_dim)
        if layer.qkv_bias is not None:
            layer.qkv_bias = pair_rope_heads(layer.qkv_bias, c.num_heads, c.num_kv_heads, c.head_dim)
        layer.gate_up = pair_gate_up(fold_norm(layer.gate_up, layer.post_norm))
        layer.input_norm = torch.ones_like(layer.input_norm)
        layer.post_norm = torch.ones_like(layer.post_norm)
