"""Make Qwen2.5-Coder-shaped model directories with random weights (bf16) on a machine without
the real ones: for speed measurements only (cost does not depend on the weights; acceptance
does, so speculative figures from these are meaningless). A small byte-level tokenizer is
saved with them so text prompts work.

    python bench/gpu/setup/random_pair.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from tiny_models import save_tokenizer  # noqa: E402

SHAPES = {
    "qwen2.5-coder-0.5b-random": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                      num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-coder-1.5b-random": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                      num_attention_heads=12, num_key_value_heads=2),
}

if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name, shape in SHAPES.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        save_tokenizer(d)
        config = Qwen2Config(vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                             tie_word_embeddings=False, eos_token_id=0, pad_token_id=0, **shape)
        torch.set_default_device("cuda")
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(str(d))
        print("saved", d)
