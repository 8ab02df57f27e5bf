"""The baseline users would pick instead: Hugging Face transformers' generate, on the same prompts.

Greedy, left-padded batches, every sequence generating exactly max_new_tokens; eager
(dynamic cache) or with a static cache and torch.compile (transformers' fast path).
"""

from __future__ import annotations

import time
from pathlib import Path


def measure(model_dir: Path, prompts: list[str], *, batch: int, max_new_tokens: int, device: str, dtype: str,
            static_compile: bool, repeats: int = 3) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    tok = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype).to(device).eval()
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                  pad_token_id=tok.pad_token_id)
    if static_compile:
        # transformers compiles the decoding forward itself when the cache is static
        kwargs.update(cache_implementation="static")
    chosen = [prompts[i % len(prompts)] for i in range(batch)]
    inputs = tok(chosen, return_tensors="pt", padding=True).to(device)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    with torch.inference_mode():
        # Warm-up; with a static cache at the measured length, so that compilation (whose
        # shapes include the cache's) happens here and not in the timed runs.
        warm = kwargs if static_compile else {**kwargs, "max_new_tokens": 8, "min_new_tokens": 8}
        model.generate(**inputs, **warm)
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            out = model.generate(**inputs, **kwargs)
            sync()
            times.append(time.perf_counter() - t0)
    wall = sorted(times)[len(times) // 2]  # the median
    generated = int((out[:, inputs["input_ids"].shape[1]:] != -1).sum())
    return {"batch": batch, "static_cache_compile": static_compile, "max_new_tokens": max_new_tokens,
            "generated_tokens": generated, "wall_s": round(wall, 3), "wall_s_all_runs": [round(t, 3) for t in times],
            "ms_per_token_per_sequence": round(1000 * wall / max_new_tokens, 4),
            "tokens_per_s": round(generated / wall, 1)}
