"""Tiny random Llama and Qwen2 models with a real byte-level BPE tokenizer, saved to disk.

They exercise every code path of the real models (GQA, RoPE, q/k/v biases, tied and untied
embeddings) in milliseconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n",
    "The quick brown fox jumps over the lazy dog. Hello, world!\n",
    "import math\nprint(math.sqrt(2))\nreturn sorted(values, key=lambda v: -v)\n",
]
EOS = "<|endoftext|>"


def save_tokenizer(out: Path, vocab_size: int = 300) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(str(out))
    return len(fast)


def make_model(out: Path, arch: str = "llama", seed: int = 0, *, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, init_range: float = 0.1,
               perturb_from: Path | None = None, perturb_scale: float = 0.0) -> Path:
    """Save a tiny random model (and tokenizer) to `out`. With perturb_from, copy that model's
    weights plus Gaussian noise instead (a draft that agrees with its target often)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(out)
    eos_id = 0
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, initializer_range=init_range, eos_token_id=eos_id, bos_token_id=None,
                  pad_token_id=eos_id)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True))
    else:
        raise ValueError(arch)
    if perturb_from is not None:
        src = type(model).from_pretrained(str(perturb_from))
        with torch.no_grad():
            for p, q in zip(model.parameters(), src.parameters()):
                p.copy_(q + perturb_scale * torch.randn_like(q) * q.std().clamp(min=1e-3))
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(str(out))
    return out
