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

from bass.config import DraftLengthConfig, RunnerConfig, SchedulerConfig  # noqa: E402
from bass.coordinator.requests import GenerationRequest  # noqa: E402
from bass.engine.batch import RaggedBatch, SequenceChunk  # noqa: E402
from bass.engine.runner import ModelRunner  # noqa: E402
from bass.kernels.triton_kquant import KQuantWeight  # noqa: E402
from bass.local import build_local_scheduler  # noqa: E402
from bass.models.gguf_convert import convert_gguf  # noqa: E402
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


def test_a_directory_without_blocks_is_refused_with_what_to_do(tmp_path, llama_target):
    with pytest.raises(FileNotFoundError, match="gguf_blocks.*convert it again"):
        ModelRunner(runner_config(llama_target, kquant_weights=True))


def test_kquant_weights_are_refused_with_int8_or_batch_invariance_and_ignored_off_triton(tiny_dir):
    from bass.errors import InvalidRequestError

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

    from bass.bench.steps import random_transformer
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
