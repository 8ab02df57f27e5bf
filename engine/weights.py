"""Load a local Hugging Face model directory (config.json + *.safetensors) into our layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from bass.engine.model import LayerWeights, TransformerConfig, TransformerWeights

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def load_config(model_dir: Path) -> TransformerConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} is not a model directory: no config.json")
    return TransformerConfig.from_hf(read_json(path))


def eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """EOS ids from generation_config.json (what generate() uses), else config.json."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            eos = read_json(path).get("eos_token_id")
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else (eos,)
    return ()


class _TensorSource:
    """Tensors by name across one or many safetensors shards."""

    def __init__(self, model_dir: Path):
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._where[name].get_tensor(name)
        except KeyError:
            raise KeyError(f"weight {name!r} missing from the checkpoint") from None


def load_weights(model_dir: Path, config: TransformerConfig, *, dtype: str,
                 device: str) -> TransformerWeights:
    src = _TensorSource(model_dir)
    torch_dtype = TORCH_DTYPES[dtype]

    def get(name: str) -> torch.Tensor:
        return src.get(name).to(device=device, dtype=torch_dtype)

    def get_optional(name: str) -> torch.Tensor | None:
        return get(name) if src.has(name) else None

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        q_bias = get_optional(attn + "q_proj.bias")
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight"),
            qkv=torch.cat([get(attn + f"{n}_proj.weight") for n in "qkv"]),
            qkv_bias=None if q_bias is None else torch.cat(
                [q_bias, get(attn + "k_proj.bias"), get(attn + "v_proj.bias")]),
            o=get(attn + "o_proj.weight"),
            o_bias=get_optional(attn + "o_proj.bias"),
            post_norm=get(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]),
            down=get(p + "mlp.down_proj.weight"),
        ))
    embed = get("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or not src.has("lm_head.weight")
    return TransformerWeights(
        embed=embed,
        layers=layers,
        final_norm=get("model.norm.weight"),
        lm_head=embed if tied else get("lm_head.weight"),
    )
