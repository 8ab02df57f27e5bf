"""config.json and generation_config.json for a GGUF's model, from its metadata and tensors.

We write the classic key names (`rope_theta`, `torch_dtype`, `rope_scaling`) on purpose:
transformers 5 still reads them, and transformers 4.x (which pyproject allows) does not know
v5's `rope_parameters`, so a v5-style file would silently get the default rope theta there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import GGUFConversionError
from .gguf_metadata import TOKEN_CONTROL, GGUFMetadata
from .gguf_tensors import TensorJob

_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# GGUF names one EOS id, but chat models end a turn with a different token than they end a
# document with (Qwen: <|im_end|> vs <|endoftext|>). Like llama.cpp, we also stop on control
# tokens with these well-known texts, so generation stops at the end of a chat turn.
_END_OF_GENERATION_TEXTS = frozenset(
    {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|end|>", "<|EOT|>"}
)


@dataclass(frozen=True)
class ModelShape:
    """The numbers the tensor layout depends on, derived once and shared."""

    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    tied: bool
    attention_bias: bool


def model_shape(meta: GGUFMetadata, jobs: list[TensorJob]) -> ModelShape:
    arch = meta.arch
    if arch not in _HF_CLASSES:
        raise GGUFConversionError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(_HF_CLASSES))})"
        )
    by_name = {j.hf_name: j for j in jobs}
    hidden = int(meta.arch_require("embedding_length"))
    n_heads = int(meta.arch_require("attention.head_count"))
    n_kv = int(meta.arch_get("attention.head_count_kv", n_heads))
    head_dim = int(meta.arch_get("attention.key_length", hidden // n_heads))
    rope_dim = meta.arch_get("rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise GGUFConversionError(f"partial rotary (rope dims {rope_dim} != head_dim {head_dim}) is not supported")
    embed = by_name.get("model.embed_tokens.weight")
    if embed is None:
        raise GGUFConversionError("GGUF has no token_embd.weight tensor")
    vocab_size, embed_hidden = embed.shape
    if embed_hidden != hidden:
        raise GGUFConversionError(f"token_embd width {embed_hidden} != embedding_length {hidden}")
    return ModelShape(
        arch=arch,
        n_layers=int(meta.arch_require("block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab_size,
        # llama.cpp omits output.weight when the model ties it to the embedding, and reuses the
        # embedding at load time; HF expresses the same with tie_word_embeddings.
        tied="lm_head.weight" not in by_name,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in by_name,
    )


def layer_biases(shape: ModelShape) -> tuple[str, ...]:
    """Per-layer bias tensors the HF class will expect."""
    if shape.arch == "qwen2":
        return ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    if shape.attention_bias:
        return ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    return ()


def build_config(meta: GGUFMetadata, shape: ModelShape, torch_dtype: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [_HF_CLASSES[shape.arch]],
        "model_type": shape.arch,
        "hidden_size": shape.hidden,
        "intermediate_size": int(meta.arch_require("feed_forward_length")),
        "num_hidden_layers": shape.n_layers,
        "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.arch_get("context_length", 2048)),
        "rms_norm_eps": float(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.arch_get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta),
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    }
    if shape.arch == "llama":
        config.update(
            head_dim=shape.head_dim,
            attention_bias=shape.attention_bias,
            mlp_bias=False,
            pretraining_tp=1,
        )
    else:  # qwen2: HF's class derives head_dim from hidden/heads; it must agree
        if shape.head_dim * shape.n_heads != shape.hidden:
            raise GGUFConversionError("qwen2 with head_dim * heads != hidden size is not supported")
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=shape.n_layers)
    return config


def build_generation_config(meta: GGUFMetadata) -> dict[str, Any]:
    eos = meta.get("tokenizer.ggml.eos_token_id")
    stop_ids = [eos] if eos is not None else []
    for key in ("eot_token_id", "eom_token_id"):
        extra = meta.get(f"tokenizer.ggml.{key}")
        if extra is not None and extra not in stop_ids:
            stop_ids.append(extra)
    if "tokenizer.ggml.tokens" in meta.values:
        for token_id, (text, kind) in enumerate(zip(meta.tokens, meta.token_types)):
            if kind == TOKEN_CONTROL and text in _END_OF_GENERATION_TEXTS and token_id not in stop_ids:
                stop_ids.append(token_id)
    generation: dict[str, Any] = {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": stop_ids[0] if len(stop_ids) == 1 else (stop_ids or None),
    }
    pad = meta.get("tokenizer.ggml.padding_token_id")
    if pad is not None:
        generation["pad_token_id"] = pad
    return {k: v for k, v in generation.items() if v is not None}


def _rope_scaling(meta: GGUFMetadata) -> dict[str, Any] | None:
    kind = meta.arch_get("rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = meta.arch_get("rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    raise GGUFConversionError(f"rope scaling type {kind!r} is not supported by this converter")
