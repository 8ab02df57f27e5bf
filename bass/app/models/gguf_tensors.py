"""GGUF tensors -> Hugging Face tensors: names, layout and dequantization.

Three things differ between a llama.cpp GGUF and an HF checkpoint of the same model:
  * names: `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`;
  * shapes: GGUF lists dimensions fastest-first (ggml `ne` order), HF slowest-first;
  * for the llama architecture only, llama.cpp's converter reorders the rows of q_proj/k_proj
    within every head (it stores rotary pairs interleaved, HF stores them as two halves), so
    we must undo that. Qwen2 files are written without that permutation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import ReaderTensor, dequantize

from .errors import GGUFConversionError

# Types whose dequantization gguf's numpy code implements and that our tests exercise or that
# ship in common llama/qwen2 files. Checked up front so an exotic file fails in a second, not
# after minutes of work.
SUPPORTED_QTYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Rows per dequantization block are chosen so a block holds about this many values: bounds the
# float32 scratch (32 MiB) however large the tensor (the 151936 x 1536 embedding is 0.9 GB).
_BLOCK_ELEMENTS = 1 << 23


@dataclass(frozen=True)
class TensorJob:
    """One GGUF tensor to dequantize into one HF tensor."""

    source: ReaderTensor
    hf_name: str
    shape: tuple[int, ...]  # HF (row-major) shape
    unpermute: bool  # undo llama.cpp's rotary row interleave (llama q/k only)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    if gguf_name == "rope_freqs.weight":
        raise GGUFConversionError(
            "GGUF has a rope_freqs tensor (llama3-style rope scaling); this converter cannot "
            "rebuild that rope_scaling config, refusing rather than producing a wrong model"
        )
    raise GGUFConversionError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart we know")


def plan_tensors(tensors: list[ReaderTensor], arch: str) -> list[TensorJob]:
    jobs = []
    for t in tensors:
        if t.tensor_type not in SUPPORTED_QTYPES:
            raise GGUFConversionError(
                f"tensor {t.name!r} uses quantization {t.tensor_type.name}, which is not supported "
                f"(supported: {', '.join(sorted(q.name for q in SUPPORTED_QTYPES))})"
            )
        name = hf_tensor_name(t.name)
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml ne order -> row-major
        unpermute = arch == "llama" and (".attn_q." in t.name or ".attn_k." in t.name)
        jobs.append(TensorJob(t, name, shape, unpermute))
    return jobs


def check_complete(jobs: list[TensorJob], n_layers: int, layer_biases: tuple[str, ...]) -> None:
    """Fail early, naming the tensor, if the file lacks something the HF model would need."""
    have = {j.hf_name for j in jobs}
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(n_layers):
        need += [f"model.layers.{i}.{part}.weight" for part in _LAYER_NAMES.values()]
        need += [f"model.layers.{i}.{part}.bias" for part in layer_biases]
    missing = [n for n in need if n not in have]
    if missing:
        raise GGUFConversionError(f"GGUF lacks {len(missing)} required tensors, e.g. {missing[:3]}")


def dequantized_blocks(job: TensorJob, head_dim: int) -> Iterator[np.ndarray]:
    """Yield the tensor as float32 row blocks in HF layout, top to bottom."""
    data = job.source.data
    if len(job.shape) == 1:
        yield _finish(job, dequantize(data, job.source.tensor_type), head_dim)
        return
    rows, cols = job.shape[0], math.prod(job.shape[1:])
    step = max(1, _BLOCK_ELEMENTS // cols)
    if job.unpermute:
        # The interleave is confined to each head's head_dim rows, so blocks made of whole heads
        # can be fixed independently.
        step = max(head_dim, step - step % head_dim)
    for start in range(0, rows, step):
        block = dequantize(data[start : start + step], job.source.tensor_type)
        yield _finish(job, block.reshape(-1, *job.shape[1:]), head_dim)


def _finish(job: TensorJob, block: np.ndarray, head_dim: int) -> np.ndarray:
    if job.unpermute:
        block = _unpermute_rotary_rows(block, head_dim)
    return block


def _unpermute_rotary_rows(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k permutation, applied to whole heads of rows.

    llama.cpp views each head's rows as (2, head_dim/2) -- HF's two rotary halves -- and
    transposes them to (head_dim/2, 2), i.e. it interleaves the halves. Viewing GGUF rows as
    (head_dim/2, 2) and transposing back restores HF's order. Works for weights and biases.
    """
    if w.shape[0] % head_dim:
        raise GGUFConversionError(f"q/k rows ({w.shape[0]}) are not a multiple of head_dim {head_dim}")
    rest = w.shape[1:]
    heads = w.shape[0] // head_dim
    return np.ascontiguousarray(w.reshape(heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))
