"""Stage by stage on the GPU: each launch of the megakernel's stage mode against the existing
path's kernels (Transformer.hidden's own functions) run on the very buffers that launch read (so that errors do not compound and a
wrong stage shows by name), then the persistent launch against the stage mode.

    PYTHONPATH=... python3 bench/gpu/kernels/draft_megakernel_check.py [TESTS_DIR]

(TESTS_DIR: where tests/test_triton_megakernel.py lives, for its tiny random models.)
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "tests")

from test_triton_megakernel import one_token_batch, random_cache, random_model  # noqa: E402

from bass.bench.steps import random_transformer, shape_config  # noqa: E402
from bass.engine.graphs import StaticInputs  # noqa: E402
from bass.engine.batch import SequenceChunk  # noqa: E402
from bass.engine.kv_cache import KVCache  # noqa: E402
from bass.kernels.triton_megakernel import DraftMegakernel  # noqa: E402


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-30))


@torch.inference_mode()
def stage_by_stage(name: str, model, batch, cache) -> None:
    mk = DraftMegakernel(model)
    c, rows = model.config, batch.num_tokens
    lin = model.linear
    out = torch.empty((rows, c.hidden_size), dtype=model.dtype, device=model.device)
    saved = cache.k.clone(), cache.v.clone()
    worst = {}

    def note(stage: str, e: float) -> None:
        worst[stage] = max(worst.get(stage, 0.0), e)

    mk.launch(batch, cache, out, 0)
    note("embed", err(mk.x[:rows], model.weights.embed[batch.input_ids]))
    cos, sin = model.cos[batch.positions], model.sin[batch.positions]
    for i, layer in enumerate(model.weights.layers):
        x = mk.x[:rows].clone()
        h, _ = model.add_norm(x, None, layer.input_norm, c.rms_norm_eps)
        k_ref, v_ref = cache.k[i].clone(), cache.v[i].clone()
        q_ref = model.rope_into_cache(lin(h, layer.qkv, layer.qkv_bias), cos, sin, k_ref, v_ref,
                                          batch.token_slots, batch.positions, c.num_heads, c.num_kv_heads)
        mk.launch(batch, cache, out, 1, i)
        note("A q", err(mk.q[:rows].view(rows, c.num_heads, c.head_dim), q_ref))
        note("A k", err(cache.k[i][batch.token_slots, batch.positions], k_ref[batch.token_slots, batch.positions]))
        note("A v", err(cache.v[i][batch.token_slots, batch.positions], v_ref[batch.token_slots, batch.positions]))
        attn_ref = model.attend(mk.q[:rows].view(rows, c.num_heads, c.head_dim).clone(), cache.k[i], cache.v[i], batch,
                                model.scale)
        mk.launch(batch, cache, out, 2, i)
        a = mk.attn[:rows].view(rows, c.num_heads, c.head_dim)
        note("B attention", err(a, attn_ref))
        for r in range(rows):
            note(f"B attention row {r}", err(a[r], attn_ref[r]))
        x = mk.x[:rows].clone()
        o_ref = (lin(mk.attn[:rows].clone(), layer.o, layer.o_bias) + x)
        mk.launch(batch, cache, out, 3, i)
        note("C o+residual", err(mk.x[:rows], o_ref))
        h, _ = model.add_norm(mk.x[:rows].clone(), None, layer.post_norm, c.rms_norm_eps)
        act_ref = model.silu_mul(lin(h, layer.gate_up))
        mk.launch(batch, cache, out, 4, i)
        note("D act", err(mk.act[:rows], act_ref))
        x = mk.x[:rows].clone()
        down_ref = lin(mk.act[:rows].clone(), layer.down) + x
        mk.launch(batch, cache, out, 5, i)
        note("E down+residual", err(mk.x[:rows], down_ref))
    final_ref, _ = model.add_norm(mk.x[:rows].clone(), None, model.weights.final_norm, c.rms_norm_eps)
    mk.launch(batch, cache, out, 6)
    note("final norm", err(out, final_ref))
    staged = out.clone()
    cache.k.copy_(saved[0])
    cache.v.copy_(saved[1])
    persistent = mk(batch, cache)
    print(f"{name}: worst relative error per stage: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    print(f"{name}: persistent == stage mode: {bool(torch.equal(persistent, staged))} "
          f"(max abs diff {float((persistent.float() - staged.float()).abs().max()):.2e}); error flag {mk.error_flag()}",
          flush=True)


def main() -> None:
    for shape, dtype, rows in (("qwen2", torch.float32, 3), ("qwen2", torch.bfloat16, 3), ("llama", torch.float32, 3),
                               ("gqa7", torch.float32, 8)):
        seed = rows * 31 + len(shape)
        model = random_model(shape, dtype, seed)
        contexts = [1 + (17 * i + seed) % 159 for i in range(rows - rows // 4)]
        stage_by_stage(f"{shape} {dtype} rows {rows}", model, one_token_batch(contexts, seed, rows // 4),
                       random_cache(model, seed))
    if not torch.cuda.is_available():
        return
    cfg = shape_config("qwen2.5-coder-0.5b")
    model = random_transformer(cfg, dtype="bfloat16", device="cuda", max_seq_len=600, attention="triton",
                               int8_weights=True)
    cache = KVCache(num_layers=cfg.num_layers, num_slots=17, max_seq_len=600, num_kv_heads=cfg.num_kv_heads,
                    head_dim=cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    inputs = StaticInputs(8, 1, 1, 16, 600, torch.device("cuda"))
    inputs.fill([SequenceChunk(slot=i, start=495 + (i * 37) % 50, tokens=[100 + i], logit_rows=1) for i in range(8)])
    stage_by_stage("0.5B bf16 rows 8 (graph batch)", model, inputs.batch, cache)


if __name__ == "__main__":
    main()
