"""A model whose projections are read from their GGUF k-quant blocks (`kquant_weights`): built from
a converted tiny GGUF (its down projections are Q4_K and Q6_K), run through the Triton kernels
(the interpreter on the CPU). Its logits are the bf16 model's up to the order of the sums, and
speculative decoding over it still gives exactly its own regular output."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton picks its interpreter when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
pytest.importorskip("gguf")

from bass.app.local import build_local_scheduler  # noqa: E402
from bass.app.models.gguf_convert import convert_gguf  # noqa: E402
from bass.coordinator.requests import GenerationRequest  # noqa: E402
from bass.core.config import DraftLengthConfig, RunnerConfig, SchedulerConfig  # noqa: E402
from bass.engine.runner import ModelRunner  # noqa: E402
from bass.kernels.batch import RaggedBatch, SequenceChunk  # noqa: E402
from bass.kernels.triton_kquant import KQuantWeight  # noqa: E402
from test_gguf_convert import write_tiny_gguf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = [(5, 17, 33), (42, 7), tuple(range(3, 20))]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("kquant")
    tiny = write_tiny_gguf(root / "tiny.gguf", "qwen2")
    return convert_gguf(tiny.path, root / "hf", dtype="bfloat16", progress=False)


def runner_config(model_dir, **kw) -> RunnerConfig:
    return RunnerConfig(model_dir=model_dir, device=DEVICE, dtype="bfloat16", num_slots=8, max_seq_len=64,
                        attention="triton", cuda_graphs=False, **kw)


def prefill_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits of every position of one prompt, as rows of one step (at most 64: the kernel's)."""
    slot = runner.cache.allocate()
    batch = RaggedBatch.build([SequenceChunk(slot=slot, start=0, tokens=ids, logit_rows=len(ids))], runner.device)
    return runner.model.forward(batch, runner.cache)


def test_the_k_quant_projections_load_as_blocks_and_compute_like_bf16(tiny_dir):
    plain = ModelRunner(runner_config(tiny_dir))
    kquant = ModelRunner(runner_config(tiny_dir, kquant_weights=True))
    layers = kquant.model.weights.layers
    assert [layer.down.fmt for layer in layers] == ["Q4_K", "Q6_K"]
    assert all(isinstance(layer.down, KQuantWeight) for layer in layers)
    assert isinstance(layers[0].qkv, torch.Tensor)  # Q8_0 / F16 / Q5_0 in the file: plain bf16
    for mine, theirs in zip(layers, plain.model.weights.layers):
        assert torch.equal(mine.down.full, theirs.down)  # the very checkpoint values
    ids = [5, 17, 33, 60, 2, 9, 11]
    got, want = prefill_logits(kquant, ids), prefill_logits(plain, ids)
    # bf16 activations rounded after sums taken in another order: noise of a few bf16 steps
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_speculation_over_a_k_quant_target_gives_its_regular_output(tiny_dir):
    def run(policy):
        s = build_local_scheduler(runner_config(tiny_dir, kquant_weights=True), runner_config(tiny_dir),
                                  scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(policy)))
        out = s.generate([GenerationRequest(prompt_ids=p, max_new_tokens=10, ignore_eos=True) for p in PROMPTS])
        return [r.sequences[0].token_ids for r in out], s

    regular, _ = run("0")
    speculative, s = run("3")
    assert speculative == regular
    assert s.target.runner.model.kquant_weights and not s.draft.runner.model.kquant_weights
    assert s.step_stats.accepted_tokens > 0


def test_a_directory_without_blocks_is_refused_with_what_to_do(llama_target):
    with pytest.raises(FileNotFoundError, match="gguf_blocks.*convert it again"):
        ModelRunner(runner_config(llama_target, kquant_weights=True))


def test_kquant_weights_are_refused_with_int8_or_batch_invariance_and_ignored_off_triton(tiny_dir):
    from bass.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="kquant_weights"):
        runner_config(tiny_dir, kquant_weights=True, int8_weights=True)
    with pytest.raises(InvalidRequestError, match="kquant_weights"):
        runner_config(tiny_dir, kquant_weights=True, batch_invariant=True)
    assert runner_config(tiny_dir, kquant_weights=True).as_draft().int8_weights is False
    cpu = RunnerConfig(model_dir=tiny_dir, device="cpu", dtype="float32", kquant_weights=True)
    assert not cpu.reads_kquant_blocks  # the PyTorch backend in fp32: the plain weights


def test_random_k_quant_models_for_benchmarks_compute_like_their_bf16_weights():
    """`bass bench steps --target-kquant`'s model: Q4_K_M's layout (q|k in Q4_K with v in Q6_K as
    one stack of two launches in even layers, one Q4_K weight in odd ones; the LM head Q6_K), and
    the same logits as a model holding the same bf16 weights as plain tensors."""
    from dataclasses import replace

    from bass.app.bench.steps import random_transformer
    from bass.engine.kv_cache import KVCache
    from bass.engine.model import Transformer, TransformerConfig, TransformerWeights
    from bass.kernels.triton_kquant import KQuantStack

    config = TransformerConfig(architecture="Qwen2ForCausalLM", vocab_size=300, hidden_size=256, intermediate_size=512,
                               num_layers=2, num_heads=2, num_kv_heads=1, head_dim=128, rms_norm_eps=1e-6,
                               rope_theta=1e6, rope_scaling=None, tie_word_embeddings=False,
                               max_position_embeddings=64)
    model = random_transformer(config, dtype="bfloat16", device=DEVICE, max_seq_len=64, attention="triton",
                               kquant_weights=True)
    even, odd = model.weights.layers
    assert isinstance(even.qkv, KQuantStack) and [p.fmt for p in even.qkv.parts] == ["Q4_K", "Q6_K"]
    assert [p.full.shape[0] for p in even.qkv.parts] == [256 + 128, 128]
    assert isinstance(odd.qkv, KQuantWeight) and odd.qkv.fmt == "Q4_K" and odd.qkv.full.shape == (512, 256)
    assert (even.down.fmt, odd.down.fmt, model.weights.lm_head.fmt) == ("Q6_K", "Q4_K", "Q6_K")

    def plain(w):
        return w if isinstance(w, torch.Tensor) else w.full

    weights = TransformerWeights(
        embed=model.weights.embed, final_norm=model.weights.final_norm, lm_head=plain(model.weights.lm_head),
        layers=[replace(layer, qkv=plain(layer.qkv), o=plain(layer.o), gate_up=plain(layer.gate_up),
                        down=plain(layer.down)) for layer in model.weights.layers])
    reference = Transformer(config, weights, max_seq_len=64, attention="triton")

    def logits(m):
        cache = KVCache(num_layers=2, num_slots=1, max_seq_len=64, num_kv_heads=1, head_dim=128,
                        dtype=torch.bfloat16, device=DEVICE)
        chunk = SequenceChunk(slot=cache.allocate(), start=0, tokens=[3, 14, 15, 92, 65], logit_rows=5)
        return m.forward(RaggedBatch.build([chunk], DEVICE), cache)

    got, want = logits(model), logits(reference)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def write_k_quant_gguf(path, arch: str):
    """A tiny GGUF whose every projection is Q4_K or Q6_K (the real pair's are too small for
    tests, the other tiny files' too narrow: k-quant rows are 256 inputs long), the llama one with
    llama.cpp's q/k row interleave and an untied Q6_K LM head."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter
    from test_gguf_convert import TinyGGUF, _add, _add_gpt2_tokenizer, _add_spm_tokenizer

    hidden, heads, kv_heads, head_dim, ffn, layers = 256, 2, 1, 128, 512, 2
    rng = np.random.default_rng(7)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    vocab = _add_spm_tokenizer(writer) if arch == "llama" else _add_gpt2_tokenizer(writer)
    tiny = TinyGGUF(path, arch, vocab, tied=arch == "qwen2")

    def add(gguf_name, hf_name, shape, qtype, permute_heads=0):
        value = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if qtype == Q.F32:
            value += 1
        _add(writer, tiny, rng, gguf_name, hf_name, value, qtype, permute_heads)

    permute = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden), Q.Q8_0)
    if not tiny.tied:
        add("output.weight", "lm_head.weight", (vocab, hidden), Q.Q6_K)
    add("output_norm.weight", "model.norm.weight", (hidden,), Q.F32)
    for i in range(layers):
        hf, more_bits = f"model.layers.{i}", Q.Q6_K if i == 0 else Q.Q4_K
        add(f"blk.{i}.attn_norm.weight", f"{hf}.input_layernorm.weight", (hidden,), Q.F32)
        add(f"blk.{i}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", (hidden,), Q.F32)
        add(f"blk.{i}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", (heads * head_dim, hidden), Q.Q4_K,
            heads if permute else 0)
        add(f"blk.{i}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden), Q.Q4_K,
            kv_heads if permute else 0)
        add(f"blk.{i}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden), more_bits)
        add(f"blk.{i}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", (hidden, heads * head_dim), Q.Q4_K)
        add(f"blk.{i}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", (ffn, hidden), Q.Q4_K)
        add(f"blk.{i}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", (ffn, hidden), Q.Q4_K)
        add(f"blk.{i}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", (hidden, ffn), more_bits)
        if arch == "qwen2":
            for name, rows in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
                add(f"blk.{i}.attn_{name}.bias", f"{hf}.self_attn.{name}_proj.bias", (rows,), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tiny


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_model_read_wholly_from_k_quant_blocks(tmp_path, arch):
    """Every projection from its blocks: each decodes to the checkpoint's bf16 tensor bit for bit
    (llama's q/k rows un-interleaved on the raw rows as on the dequantized ones), q|k|v of layer 0
    (v in Q6_K) runs as a stack, and the model's logits are the bf16 model's."""
    from safetensors import safe_open

    from bass.engine.weights import GGUF_BLOCKS_FILE
    from bass.kernels.triton_kquant import KQuantStack

    tiny = write_k_quant_gguf(tmp_path / "tiny.gguf", arch)
    out = convert_gguf(tiny.path, tmp_path / "hf", dtype="bfloat16", progress=False)
    with safe_open(str(out / GGUF_BLOCKS_FILE), "pt") as blocks, safe_open(str(out / "model.safetensors"), "pt") as m:
        formats = blocks.metadata()
        names = set(blocks.keys())
        assert len(names) == 2 * 7 + (arch == "llama")
        for name in names:
            decoded = KQuantWeight.from_gguf_blocks(formats[name], blocks.get_tensor(name)).full
            assert torch.equal(decoded, m.get_tensor(name)), name
    plain = ModelRunner(runner_config(out))
    kquant = ModelRunner(runner_config(out, kquant_weights=True))
    first = kquant.model.weights.layers[0]
    assert isinstance(first.qkv, KQuantStack) and [p.fmt for p in first.qkv.parts] == ["Q4_K", "Q6_K"]
    assert isinstance(kquant.model.weights.lm_head, KQuantWeight if arch == "llama" else torch.Tensor)
    ids = [5, 17, 33, 60, 2, 9, 11]
    got, want = prefill_logits(kquant, ids), prefill_logits(plain, ids)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_bass_serve_with_kquant_weights_in_its_config_file(tiny_dir, tmp_path):
    """As a user turns it on: `[target] kquant_weights = true` in the TOML (a bad value named by its
    key), then greedy text through the real gRPC services (the draft in the target's process)
    equals the k-quant target's own regular decoding in-process."""
    from bass.app.client import BassClient
    from bass.core.config import ServeConfig, load_config_file
    from bass.core.errors import InvalidRequestError
    from services import start_services

    config = tmp_path / "bass.toml"
    config.write_text(f'[target]\nmodel_dir = "{tiny_dir}"\nkquant_weights = true\n')
    assert load_config_file(config, ServeConfig).target.runner_config().kquant_weights
    config.write_text(f'[target]\nmodel_dir = "{tiny_dir}"\nkquant_weights = "sometimes"\n')
    with pytest.raises(InvalidRequestError, match="target.kquant_weights"):
        load_config_file(config, ServeConfig)

    s = build_local_scheduler(runner_config(tiny_dir, kquant_weights=True), None,
                              scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse("0")))
    (want,) = s.generate([GenerationRequest(prompt_ids=PROMPTS[2], max_new_tokens=10, ignore_eos=True)])
    worker = dict(device=DEVICE, dtype="bfloat16", attention="triton")
    services = start_services(tiny_dir, tiny_dir, policy="3", colocate=True, num_slots=4, max_seq_len=64,
                              target_options=dict(kquant_weights=True, **worker), draft_options=worker)
    try:
        with BassClient(services.address, timeout_s=120) as client:
            got = client.generate(list(PROMPTS[2]), max_new_tokens=10, ignore_eos=True)
    finally:
        services.stop()
    assert list(got.sequences[0].token_ids) == list(want.sequences[0].token_ids)
