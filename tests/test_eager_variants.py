"""Kernel variants compiled at warm-up (ModelRunner.compile_eager_variants): a step outside the
CUDA graphs must not compile a Triton variant inside a request (0.1-0.3 s on a fresh H100).

On the CPU: the representative steps cover every attention variant that random ragged batches
launch, and the warm-up runs one forward per representative on scratch slots and gives them
back (Triton's interpreter). On a GPU: after a runner's warm-up, ragged eager steps compile no
new attention variant.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton
pytest.importorskip("triton")

from bass.kernels.triton_attention import plan_key, plan_launch, plan_representatives  # noqa: E402


@pytest.mark.parametrize("group, kv_heads, head_dim", [(6, 2, 128), (7, 2, 64), (2, 2, 8), (4, 4, 64)])
@pytest.mark.parametrize("max_len, max_batch", [(2048, 64), (1024, 8), (96, 3)])
def test_the_representatives_launch_every_variant_a_ragged_batch_launches(group, kv_heads, head_dim, max_len,
                                                                         max_batch):
    sms = 132
    shapes = plan_representatives(group, kv_heads, head_dim, sms, max_len, max_batch)
    covered = {plan_key(plan_launch([q] * b, [ctx] * b, group, kv_heads, head_dim, sms)) for b, q, ctx in shapes}
    assert len(covered) == len(shapes)  # one step a variant
    assert all(b <= max_batch and q <= ctx <= max_len for b, q, ctx in shapes)
    rng = random.Random(group * 1000 + max_len)
    for _ in range(3000):
        batch = rng.randint(1, max_batch)
        q_lens = [rng.randint(1, min(128, max_len)) for _ in range(batch)]
        ctx_lens = [rng.randint(q, max_len) for q in q_lens]
        key = plan_key(plan_launch(q_lens, ctx_lens, group, kv_heads, head_dim, sms))
        assert key in covered, (q_lens, ctx_lens, key)


def test_the_warm_up_runs_one_step_a_variant_and_gives_the_slots_back(qwen_target):
    from bass.core.config import RunnerConfig
    from bass.engine.runner import ModelRunner

    device = "cuda" if torch.cuda.is_available() else "cpu"
    runner = ModelRunner(RunnerConfig(model_dir=qwen_target, device=device, num_slots=3, max_seq_len=96,
                                      attention="triton", cuda_graphs=False))
    steps = []
    forward = runner.model.forward
    runner.model.forward = lambda batch, cache: steps.append((batch.num_seqs, batch.max_q, batch.max_ctx)) or \
        forward(batch, cache)
    free = runner.cache.free_slots
    runner.compile_eager_variants()
    mc = runner.model_config
    from bass.kernels.triton_attention import _num_sms

    expected = plan_representatives(mc.num_heads // mc.num_kv_heads, mc.num_kv_heads, mc.head_dim,
                                    _num_sms(runner.device), 96, 3)
    assert steps == expected and len(steps) >= 2
    assert runner.cache.free_slots == free


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles on a GPU (the interpreter compiles nothing)")
def test_after_the_warm_up_ragged_eager_steps_compile_no_attention_variant(qwen_target):
    from bass.core.config import RunnerConfig
    from bass.core.worker_api import AddSequence
    from bass.engine.runner import ModelRunner
    from bass.kernels.triton_attention import _ragged_attn_fwd

    runner = ModelRunner(RunnerConfig(model_dir=qwen_target, device="cuda", dtype="bfloat16", num_slots=8,
                                      max_seq_len=1100, attention="triton"))
    runner.warm_up(graph_shapes=[(k + 1, k + 1) for k in range(4)])
    cache = _ragged_attn_fwd.device_caches[torch.cuda.current_device()][0]
    compiled = len(cache)
    rng = random.Random(7)
    with torch.inference_mode():
        for round_ in range(4):
            lengths = [rng.randint(5, 1000) for _ in range(rng.randint(1, 8))]
            runner.add([AddSequence(100 * round_ + i, tuple(rng.randrange(50) for _ in range(n)))
                        for i, n in enumerate(lengths)])
            states = [runner.get(100 * round_ + i) for i in range(len(lengths))]
            extra = [[3] * rng.randint(0, 12) for _ in states]  # a ragged step: eager
            runner.forward(list(zip(states, extra)), [1] * len(states))
            runner.release([100 * round_ + i for i in range(len(lengths))])
    assert len(cache) == compiled
