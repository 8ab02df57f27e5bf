"""A decoder-only transformer of the Llama family (Qwen2 included) over ragged batches.

The math follows Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM exactly (RMSNorm in fp32,
rotate-half RoPE, grouped-query attention, SwiGLU), so greedy outputs match token for token.
Projections are fused at load time (q|k|v and gate|up) so each layer runs four GEMMs over all
tokens of the batch at once; only attention sees the sequences' boundaries.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bass.engine import fused_layers
from bass.engine.kv_cache import KVCache
from bass.kernels import attention_kernel
from bass.kernels.batch import RaggedBatch
from bass.kernels.cuda_skinny import Rope, row_groups_for
from bass.kernels.elementwise import add_rms_norm_reference, rope_into_cache_reference, silu_mul_reference

log = logging.getLogger(__name__)
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
_ARRIVAL_COUNTERS = 4096


@dataclass(frozen=True)
class TransformerConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "TransformerConfig":
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}")
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        # transformers 5 moved rope settings into `rope_parameters`; 4.x kept them at top level.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3"):
            raise ValueError(f"unsupported rope type {rope_type!r}")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        )


@dataclass
class LayerWeights:
    # The projections are Int8Weight in a model built with int8_weights (a draft).
    input_norm: torch.Tensor
    qkv: Any  # torch.Tensor [(heads + 2 * kv_heads) * head_dim, hidden] or Int8Weight
    qkv_bias: torch.Tensor | None
    o: Any
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Any  # [2 * intermediate, hidden]
    down: Any


@dataclass
class TransformerWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: Any  # torch.Tensor [vocab, hidden] or Int8Weight


def rope_inv_freq(config: TransformerConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    # llama3: scale low frequencies, keep high ones, blend in between.
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, blended, scaled)


class Transformer:
    def __init__(self, config: TransformerConfig, weights: TransformerWeights, *, max_seq_len: int,
                 attention: str = "pad", batch_invariant: bool = False, int8_weights: bool = False,
                 few_row_cuda: bool = False, fuse_layers: bool = True, programmatic_launch: bool = True):
        """batch_invariant: every row's values are computed the same way whatever the batch
        around it (one GEMM tiling without split-K, attention with one launch plan and no
        split-KV), so a sequence's logits, and so its tokens, do not depend on what it is
        batched with or on how many tokens each step runs. Costs speed; see RunnerConfig.
        int8_weights (a draft's option, with the Triton kernels; ignored otherwise): the
        projections and the LM head also kept as weight-only int8, which products of up to
        kernels/triton_int8.MAX_INT8_ROWS rows read (half the bytes); they change the values.
        RunnerConfig refuses the two together.
        few_row_cuda (bf16 with the Triton kernels on CUDA, not batch-invariant): products of
        1-16 rows through the CUDA few-row kernel where it times faster than the path above on
        this GPU, timed here over the model's own weights (kernels/skinny_linear.py).
        fuse_layers (with the few-row CUDA kernel): steps of up to 16 tokens run each layer in
        five launches instead of nine (int8 or bf16 weights), the norms, RoPE and cache writes,
        residual adds and SiLU * up in the products' epilogues, and longer steps in seven
        (_folded_hidden) (engine/fused_layers.py; changes the weights' layout and the values'
        rounding).
        programmatic_launch (Hopper and newer; ignored elsewhere): the attention kernel and the
        few-row products launch as programmatic dependent launches, each started while the
        kernel before it runs (a product loads its first weights meanwhile) and waiting for it
        only before reading its outputs (kernels/cuda/skinny_gemm.cu). Same values."""
        self.config = config
        self.weights = weights
        self.attend = attention_kernel(attention)
        if attention == "triton":
            # Split-KV arrival counters that the kernel leaves zeroed: one buffer for every
            # layer and step, instead of a memset before each attention call. Grids that split
            # are small (under two programs per SM), so a few thousand counters cover them.
            counters = torch.zeros(_ARRIVAL_COUNTERS, dtype=torch.int32, device=weights.embed.device)
            self.attend = functools.partial(self.attend, arrivals=counters, programmatic=programmatic_launch)
        self.linear = F.linear
        if batch_invariant:
            from bass.kernels import triton_attention

            if weights.embed.device.type == "cpu" and not triton_attention._INTERPRETED:
                raise ValueError("the batch-invariant mode runs Triton kernels: it needs a CUDA device (on the CPU "
                                 "only under Triton's interpreter, TRITON_INTERPRET=1, which tests use)")
            from bass.kernels.triton_matmul import InvariantLinear

            self.linear = InvariantLinear(weights.embed.device)
            if attention == "triton":
                # The launch heuristics split the key range by batch size; splits of a fixed
                # number of keys, and one code path for every key tile, keep each row's
                # reduction order and rounding.
                self.attend = functools.partial(self.attend, batch_invariant=True)
        # With the Triton attention kernel (so Triton is there), the elementwise groups run as
        # fused Triton kernels too; the references compute the same values in PyTorch.
        if attention == "triton":
            from bass.kernels.triton_elementwise import add_rms_norm, rope_into_cache, silu_mul

            self.add_norm, self.rope_into_cache, self.silu_mul = add_rms_norm, rope_into_cache, silu_mul
        else:
            self.add_norm, self.rope_into_cache, self.silu_mul = (add_rms_norm_reference, rope_into_cache_reference,
                                                                  silu_mul_reference)
        self.int8_weights = int8_weights and attention == "triton"
        few_row_kernel = None
        if (few_row_cuda and attention == "triton" and not batch_invariant and weights.embed.device.type == "cuda"
                and weights.embed.dtype == torch.bfloat16):
            from bass.kernels.cuda_skinny import load_skinny_gemm

            few_row_kernel = load_skinny_gemm(weights.embed.device, programmatic=programmatic_launch)
        self.fused_layers = few_row_kernel is not None and fuse_layers and fused_layers.can_fuse(config)
        self.time_layer_paths = True  # see layer_paths
        self.folded_norms = False
        if self.fused_layers:
            log.info("decode steps of up to %d tokens run fused layers (engine/fused_layers.py)",
                     fused_layers.MAX_FUSED_ROWS)
            self.fold_norms()
        if self.int8_weights:
            from bass.kernels.triton_int8 import Int8Linear, Int8Weight

            for layer in weights.layers:
                for name in ("qkv", "o", "gate_up", "down"):
                    setattr(layer, name, Int8Weight.quantize(getattr(layer, name)))
            weights.lm_head = Int8Weight.quantize(weights.lm_head)
            self.linear = Int8Linear(weights.embed.device)
        if few_row_kernel is not None:
            self._plan_few_row_products(few_row_kernel, weights)
        self.scale = config.head_dim ** -0.5
        device, dtype = weights.embed.device, weights.embed.dtype
        positions = torch.arange(max_seq_len, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, rope_inv_freq(config).to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)

    def fold_norms(self) -> None:
        """Change the weights to the fused layers' layout (engine/fused_layers.prepare_weights:
        the norms folded into the projections, gate|up and the rotary halves paired), before
        any quantization. Steps the fused products do not take then run _folded_hidden. Called
        at build where the few-row kernel fuses layers; tests call it on the CPU, where no step
        is fused."""
        fused_layers.prepare_weights(self.weights, self.config)
        self.silu_mul = functools.partial(self.silu_mul, paired=True)
        self.rope_into_cache = functools.partial(self.rope_into_cache, paired=True)
        self.folded_norms = True

    def _plan_few_row_products(self, kernel, weights: "TransformerWeights") -> None:
        from bass.kernels.skinny_linear import SkinnyLinear, plan_products

        projections = {name: [(getattr(layer, name), getattr(layer, f"{name}_bias", None)) for layer in weights.layers]
                       for name in ("qkv", "o", "gate_up", "down")}
        planned = plan_products(kernel, self.linear, projections)
        if planned is None and self.fused_layers:  # the fused layers take the kernel with its default launches
            planned = SkinnyLinear(kernel, self.linear, {}, [])
        if planned is not None:  # routes only what it planned: the other shapes keep their path
            self.linear = planned

    def layer_paths(self, rows: int) -> tuple[bool, ...]:
        """The values of hidden()'s `fused` worth timing for a captured step of `rows` tokens
        (engine/graphs.py keeps the faster): both where the fused layers would run the step in
        their second 8-row group (9-16 rows), else the fused default alone. Why: on an H200 the
        bf16 target's fused layers were 4-8% slower than the layers unfused at 9-16 rows and
        6-13% faster at 1-8, while the int8 draft's were level or faster at 9-16
        (bench/results/2026-11-28-h200-auto-and-layer-paths, `bass bench steps`): a product with its
        epilogue over two row groups costs more than the plan timed for the plain product.
        time_layer_paths = False keeps the default everywhere (a test comparing two builds bit
        for bit)."""
        second_group = row_groups_for(rows) > 1 and rows <= fused_layers.MAX_FUSED_ROWS
        if self.fused_layers and self.time_layer_paths and second_group:
            return (True, False)
        return (True,)

    @property
    def product_timings(self) -> list:
        """What the few-row planning measured at load (benchmarks report it); empty without it."""
        return getattr(self.linear, "timings", [])

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """Run the batch, write its keys/values into `cache`, return fp32 logits for
        `batch.logit_rows` ([R, vocab])."""
        return self.logits(self.hidden(batch, cache))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final hidden rows (the LM head, kept out of CUDA graphs so that their
        static outputs are [R, hidden] rather than [R, vocab])."""
        if self.int8_weights:  # fp32 straight from the kernel
            return self.linear(hidden, self.weights.lm_head, None, torch.float32)
        return self.linear(hidden, self.weights.lm_head).float()

    @torch.inference_mode()
    def hidden(self, batch: RaggedBatch, cache: KVCache, fused: bool = True) -> torch.Tensor:
        """Run the batch, write its keys/values into `cache`, return the final-normed hidden
        states of `batch.logit_rows` ([R, hidden]). fused=False: a step the fused layers would
        take runs the folded ones instead (see layer_paths).

        The residual stream x and the normed input h of the next block travel together, so each
        residual add is fused with the norm that follows it."""
        if fused and self.fused_layers and batch.input_ids.shape[0] <= fused_layers.MAX_FUSED_ROWS:
            return self._fused_hidden(batch, cache)
        if self.folded_norms:
            return self._folded_hidden(batch, cache)
        c, layers, eps = self.config, self.weights.layers, self.config.rms_norm_eps
        q_size = c.num_heads * c.head_dim
        cos, sin = self.cos[batch.positions], self.sin[batch.positions]
        x = self.weights.embed[batch.input_ids]
        h, x = self.add_norm(x, None, layers[0].input_norm, eps)
        for i, layer in enumerate(layers):
            q = self.rope_into_cache(self.linear(h, layer.qkv, layer.qkv_bias), cos, sin, cache.k[i], cache.v[i],
                                     batch.token_slots, batch.positions, c.num_heads, c.num_kv_heads)
            attn = self.attend(q, cache.k[i], cache.v[i], batch, self.scale)
            h, x = self.add_norm(self.linear(attn.reshape(-1, q_size), layer.o, layer.o_bias), x, layer.post_norm, eps)
            mlp = self.linear(self.silu_mul(self.linear(h, layer.gate_up)), layer.down)
            if i + 1 < len(layers):
                h, x = self.add_norm(mlp, x, layers[i + 1].input_norm, eps)
        # The last residual add and the final norm, for the rows that need logits only. Through
        # add_norm (one program per row on the GPU), not a PyTorch reduction, whose split of the
        # work, and so its rounding, changes with the number of rows.
        rows = batch.logit_rows
        h, _ = self.add_norm(mlp[rows], x[rows], self.weights.final_norm, eps)
        return h

    def _fused_hidden(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """hidden() for a step of <= 16 tokens through the fused layers (engine/fused_layers.py):
        the residual stream x is updated in place by the o and down products; q is rewritten by
        each layer's q|k|v product."""
        c, layers, eps, product = self.config, self.weights.layers, self.config.rms_norm_eps, self.linear.fused
        q_size = c.num_heads * c.head_dim
        x = self.weights.embed[batch.input_ids]
        q = torch.empty((x.shape[0], c.num_heads, c.head_dim), dtype=x.dtype, device=x.device)
        for i, layer in enumerate(layers):
            rope = Rope(self.cos, self.sin, batch.positions, batch.token_slots, q, cache.k[i], cache.v[i])
            product(x, layer.qkv, layer.qkv_bias, norm_eps=eps, rope=rope)
            attn = self.attend(q, cache.k[i], cache.v[i], batch, self.scale)
            product(attn.reshape(-1, q_size), layer.o, layer.o_bias, out=x, residual=x)
            product(product(x, layer.gate_up, norm_eps=eps, silu_pairs=True), layer.down, out=x, residual=x)
        rows = batch.logit_rows
        h, _ = self.add_norm(x[rows], None, self.weights.final_norm, eps)
        return h

    def _folded_hidden(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """hidden() over folded weights (fold_norms) for a step the fused products do not take
        (more than 16 tokens: a verification of many sequences, a draft's catch-up, a prefill).
        Seven launches a layer instead of nine: each product reads the un-normed residual
        stream x, the kernel after it scales its rows by 1 / rms(x) (and adds q|k|v's bias),
        and the o and down products add into x in place, so no norm or residual-add kernel
        runs between them."""
        c, layers, eps = self.config, self.weights.layers, self.config.rms_norm_eps
        q_size = c.num_heads * c.head_dim
        cos, sin = self.cos[batch.positions], self.sin[batch.positions]
        x = self.weights.embed[batch.input_ids]
        for i, layer in enumerate(layers):
            q = self.rope_into_cache(self.linear(x, layer.qkv), cos, sin, cache.k[i], cache.v[i], batch.token_slots,
                                     batch.positions, c.num_heads, c.num_kv_heads, norm_of=x, eps=eps,
                                     bias=layer.qkv_bias)
            attn = self.attend(q, cache.k[i], cache.v[i], batch, self.scale)
            self._add_product(x, attn.reshape(-1, q_size), layer.o, layer.o_bias)
            self._add_product(x, self.silu_mul(self.linear(x, layer.gate_up), norm_of=x, eps=eps), layer.down, None)
        rows = batch.logit_rows
        h, _ = self.add_norm(x[rows], None, self.weights.final_norm, eps)
        return h

    def _add_product(self, x: torch.Tensor, a: torch.Tensor, weight, bias: torch.Tensor | None) -> None:
        """x += a @ weight.T (+ bias), in place. A plain weight's product adds x itself (the
        GEMM's beta = 1: one rounding, no kernel of its own); an int8 weight's product is added."""
        if isinstance(weight, torch.Tensor):
            x.addmm_(a, weight.t())
            if bias is not None:
                x.add_(bias)
        else:
            x.add_(self.linear(a, weight, bias))
