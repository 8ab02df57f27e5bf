"""What one decode step costs, measured: `bass bench steps`.

Builds models with random weights at real shapes (cost does not depend on the values), fills
a batch of sequences to a context length, then times single forwards with CUDA events
(warm-up first, median of repeats): the target verifying k + 1 tokens per sequence and the
draft running one token per sequence, for each attention kernel and with or without CUDA
graphs. From those it derives regular decoding's cost per token and speculative decoding's
ms per token per sequence at a given acceptance alpha, E(k) = (1 - alpha^(k+1)) / (1 - alpha)
tokens per step costing k draft forwards plus one verification. Derived numbers are labelled
as such in the output.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bass.core.config import RunnerConfig
from bass.core.worker_api import AddSequence
from bass.engine.model import LayerWeights, Transformer, TransformerConfig, TransformerWeights
from bass.engine.runner import ModelRunner
from bass.engine.weights import TORCH_DTYPES

# Shapes of the Qwen2.5-Coder family (config.json values).
SHAPES = {
    "qwen2.5-coder-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                               num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=False),
    "qwen2.5-coder-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                               num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=False),
    "qwen2.5-coder-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                             num_heads=28, num_kv_heads=4, head_dim=128, tie_word_embeddings=False),
}


def shape_config(name: str) -> TransformerConfig:
    return TransformerConfig(architecture="Qwen2ForCausalLM", rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
                             max_position_embeddings=32768, **SHAPES[name])


def random_transformer(config: TransformerConfig, *, dtype: str, device: str, max_seq_len: int,
                       attention: str, int8_weights: bool = False, batch_invariant: bool = False,
                       few_row_cuda: bool = False, fuse_layers: bool = True,
                       programmatic_launch: bool = True) -> Transformer:
    dt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dt)

    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = [LayerWeights(input_norm=torch.ones(c.hidden_size, dtype=dt, device=device),
                           qkv=w(q + 2 * kv, c.hidden_size), qkv_bias=w(q + 2 * kv), o=w(c.hidden_size, q), o_bias=None,
                           post_norm=torch.ones(c.hidden_size, dtype=dt, device=device),
                           gate_up=w(2 * c.intermediate_size, c.hidden_size), down=w(c.hidden_size, c.intermediate_size))
              for _ in range(c.num_layers)]
    embed = w(c.vocab_size, c.hidden_size)
    weights = TransformerWeights(embed=embed, layers=layers, final_norm=torch.ones(c.hidden_size, dtype=dt, device=device),
                                 lm_head=w(c.vocab_size, c.hidden_size))
    return Transformer(config, weights, max_seq_len=max_seq_len, attention=attention, int8_weights=int8_weights,
                       batch_invariant=batch_invariant, few_row_cuda=few_row_cuda, fuse_layers=fuse_layers,
                       programmatic_launch=programmatic_launch)


def weight_bytes(config: TransformerConfig, dtype: str) -> int:
    c = config
    per_layer = ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim * c.hidden_size + c.hidden_size * c.num_heads * c.head_dim
                 + 3 * c.hidden_size * c.intermediate_size)
    params = c.num_layers * per_layer + 2 * c.vocab_size * c.hidden_size  # + embed row reads are negligible
    return params * torch.finfo(TORCH_DTYPES[dtype]).bits // 8


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float


class StepTimer:
    """A batch of `batch` sequences of `context` tokens on one model, ready to time forwards."""

    def __init__(self, model: Transformer, *, batch: int, context: int, max_q: int, attention: str,
                 cuda_graphs: bool, device: str):
        cfg = RunnerConfig(model_dir=Path("/nonexistent"), device=device, dtype=str(model.dtype).split(".")[-1],
                           num_slots=batch, max_seq_len=context + max_q + 8, attention=attention,
                           cuda_graphs=cuda_graphs)
        self.runner = ModelRunner(cfg, model=model)
        # Graphs replay only shapes captured at warm-up: those time_forward runs (q tokens, q rows).
        self.runner.warm_up(graph_shapes=[(q, q) for q in range(1, max_q + 1)])
        gen = torch.Generator().manual_seed(1)
        vocab = model.config.vocab_size
        for i in range(batch):
            self.runner.add([AddSequence(i, tuple(torch.randint(0, vocab, (context,), generator=gen).tolist()))])
        self.states = [self.runner.get(i) for i in range(batch)]

    @torch.inference_mode()
    def time_forward(self, q: int, repeats: int, warmup: int = 3) -> Timing:
        """Each sequence runs its pending token plus q - 1 more; the cache is rolled back after."""
        runner, extra = self.runner, [7] * (q - 1)
        lengths = [runner.cache.length(s.slot) for s in self.states]
        times = []
        for i in range(warmup + repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = runner.forward([(s, extra) for s in self.states], [q] * len(self.states))
            end.record()
            logits.argmax(-1)
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
            for s, n in zip(self.states, lengths):
                runner.cache.truncate(s.slot, n)
        times.sort()
        return Timing(statistics.median(times), times[len(times) // 10], times[(9 * len(times)) // 10])


_CONFIG_SUFFIXES = ("-serial", "-unfused", "-invariant", "-cuda")  # in the order a name carries them, last first


def _attention(config_name: str) -> str:
    for suffix in _CONFIG_SUFFIXES:
        config_name = config_name.removesuffix(suffix)
    return config_name


def expected_tokens(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def measure(target: str, draft: str, *, batches: list[int], draft_lengths: list[int], context: int, alpha: float,
            configs: list[tuple[str, bool]], dtype: str, repeats: int, progress=None,
            draft_int8: bool = False) -> list[dict]:
    device = "cuda"
    rows = []
    max_q = max(draft_lengths) + 1
    models = {}
    # "NAME-invariant": attention NAME with the target in its batch-invariant mode (the draft as usual);
    # "NAME-cuda": both models' 1-16-row products through the CUDA few-row kernel where it times faster
    # (and an int8 draft's decode layers fused around it); "NAME-cuda-unfused": the same, layers unfused;
    # "...-serial": programmatic dependent launch off (RunnerConfig.programmatic_launch).
    for name in {target, draft}:
        models[name] = {att: random_transformer(shape_config(name), dtype=dtype, device=device,
                                                max_seq_len=context + max_q + 8, attention=_attention(att),
                                                batch_invariant=name == target and "-invariant" in att,
                                                few_row_cuda="-cuda" in att,
                                                fuse_layers="-unfused" not in att,
                                                programmatic_launch=not att.endswith("-serial"),
                                                int8_weights=draft_int8 and name == draft)
                        for att in {a for a, _ in configs}}
    for config_name, graphs in configs:
        attention = _attention(config_name)
        for batch in batches:
            t0 = time.perf_counter()
            tgt = StepTimer(models[target][config_name], batch=batch, context=context, max_q=max_q, attention=attention,
                            cuda_graphs=graphs, device=device)
            drf = StepTimer(models[draft][config_name], batch=batch, context=context, max_q=max_q, attention=attention,
                            cuda_graphs=graphs, device=device)
            draft_ms = drf.time_forward(1, repeats).median_ms
            regular = tgt.time_forward(1, repeats)
            row = {"attention": config_name, "cuda_graphs": graphs, "batch": batch, "context": context,
                   "target_forward_q1_ms": round(regular.median_ms, 4),
                   "target_forward_q1_p10_p90_ms": [round(regular.p10_ms, 4), round(regular.p90_ms, 4)],
                   "draft_forward_q1_ms": round(draft_ms, 4),
                   "regular_ms_per_token_per_sequence": round(regular.median_ms, 4),
                   "verify_ms": {}, "derived_speculative_ms_per_token_per_sequence": {}}
            best = (0, regular.median_ms)
            for k in draft_lengths:
                verify = tgt.time_forward(k + 1, repeats).median_ms
                per_token = (k * draft_ms + verify) / expected_tokens(alpha, k)
                row["verify_ms"][k] = round(verify, 4)
                row["derived_speculative_ms_per_token_per_sequence"][k] = round(per_token, 4)
                if per_token < best[1]:
                    best = (k, per_token)
            for role, name in (("target", target), ("draft", draft)):
                timings = models[name][config_name].product_timings
                if timings:  # what the few-row planning measured at load, per projection and row bucket
                    row[f"{role}_fused_layers"] = models[name][config_name].fused_layers
                    row[f"{role}_few_row_plans"] = [[t.projection, t.rows, t.fallback_us, t.kernel_us, t.chosen]
                                                    for t in timings]
            for role, timer in (("target", tgt), ("draft", drf)):
                paths = timer.runner.graphs.layer_path_timings if timer.runner.graphs is not None else []
                if paths:  # steps of 9-16 tokens: fused and folded layers as timed at capture
                    row[f"{role}_layer_paths"] = [[p.bucket, p.q, p.fused_us, p.folded_us, p.fused] for p in paths]
            row["derived_best"] = {"k": best[0], "ms_per_token_per_sequence": round(best[1], 4),
                                   "speedup_over_regular": round(regular.median_ms / best[1], 3)}
            rows.append(row)
            del tgt, drf
            torch.cuda.empty_cache()
            if progress:
                progress(f"{config_name} graphs={graphs} batch={batch}: regular {regular.median_ms:.3f} ms, "
                         f"best k={best[0]} {best[1]:.3f} ms/token/seq ({time.perf_counter() - t0:.0f} s)")
    return rows
