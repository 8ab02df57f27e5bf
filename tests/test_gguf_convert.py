"""GGUF -> Hugging Face conversion, checked on tiny llama and qwen2 GGUFs written here.

Each tiny file mixes tensor types (F32, F16, BF16, Q8_0, Q5_0, and hand-made Q4_K/Q6_K blocks,
since gguf-py cannot quantize K-types) and carries tokenizer metadata. We check the converted
tensors against the originals, the config fields, transformers loading the directory, and the
logits against an independently built HF model (and transformers' own GGUF loader when
`accelerate`, which that loader needs, is installed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors import safe_open  # noqa: E402

from bass.app.models import gguf_tensors  # noqa: E402
from bass.app.models.errors import GGUFConversionError, ModelSetupError  # noqa: E402
from bass.app.models.gguf_convert import convert_gguf  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, CONTEXT = 64, 4, 2, 16, 256, 2, 128
ROPE_THETA, RMS_EPS = 500000.0, 1e-5
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@dataclass
class TinyGGUF:
    path: Path
    arch: str
    vocab_size: int
    tied: bool
    expected: dict[str, np.ndarray] = field(default_factory=dict)  # HF name -> value after GGUF rounding
    exact: set[str] = field(default_factory=set)  # stored as F32: must survive bit for bit
    originals: dict[str, np.ndarray] = field(default_factory=dict)  # before quantization


# ---------------------------------------------------------------------------------------------
# Writing tiny GGUFs


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row reordering (HF layout -> GGUF layout), reimplemented for the test."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _k_quant_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Random but valid K-quant bytes with small scales (gguf-py has no K-quant quantizer)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d, dmin are the first two float16s of each block
        raw[..., 0:4] = np.frombuffer(np.array([1e-3, 1e-3], dtype=np.float16).tobytes(), np.uint8)
    elif qtype == Q.Q6_K:  # d is the trailing float16
        raw[..., size - 2 : size] = np.frombuffer(np.array([2e-4], dtype=np.float16).tobytes(), np.uint8)
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, -1)


def _add(writer, tiny: TinyGGUF, rng, gguf_name: str, hf_name: str, value: np.ndarray, qtype: Q, permute_heads=0):
    """Store `value` (HF layout) as `qtype`; record what the converter must give back."""
    tiny.originals[hf_name] = value
    stored = _llama_cpp_permute(value, permute_heads) if permute_heads else value
    if qtype == Q.F32:
        writer.add_tensor(gguf_name, stored.astype(np.float32))
        tiny.expected[hf_name] = value.astype(np.float32)
        tiny.exact.add(hf_name)
        return
    if qtype == Q.F16:
        writer.add_tensor(gguf_name, stored.astype(np.float16))
        tiny.expected[hf_name] = value.astype(np.float16).astype(np.float32)
        return
    if qtype in (Q.Q4_K, Q.Q6_K):
        raw = _k_quant_blocks(rng, *value.shape, qtype)
        tiny.originals[hf_name] = gguf.quants.dequantize(raw, qtype)
    else:
        raw = gguf.quants.quantize(stored.astype(np.float32), qtype)
    writer.add_tensor(gguf_name, raw, raw_dtype=qtype)
    dequantized = gguf.quants.dequantize(raw, qtype)
    # Row reordering commutes with these row-wise block quantizations, so the un-permuted
    # dequantized tensor is exactly what the converter must produce.
    if permute_heads:
        dequantized = _llama_cpp_permute_inverse(dequantized, permute_heads)
    tiny.expected[hf_name] = dequantized


def _llama_cpp_permute_inverse(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


GPT2_MERGES = [("d", "e"), ("de", "f"), ("\u0120", "f"), ("i", "b"), ("\u0120f", "ib"), ("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]


def _add_gpt2_tokenizer(writer) -> int:
    tokens = _byte_level_alphabet() + ["".join(m) for m in GPT2_MERGES]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    specials = [("<|endoftext|>", gguf.TokenType.CONTROL), ("<|im_start|>", gguf.TokenType.CONTROL),
                ("<|im_end|>", gguf.TokenType.CONTROL), ("<tool_call>", gguf.TokenType.USER_DEFINED)]  # fmt: skip
    for text, kind in specials:
        tokens.append(text)
        types.append(kind)
    while len(tokens) < 288:  # llama.cpp pads the vocabulary up to the embedding size
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in GPT2_MERGES])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    return len(tokens)


SPM_PIECES = ["\u2581", "e", "h", "l", "o", "t", "w", "r", "d", "\u2581t", "he", "\u2581the", "ll", "llo",
              "\u2581h", "\u2581he", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world"]  # fmt: skip


def _add_spm_tokenizer(writer) -> int:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(SPM_PIECES)
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    return len(tokens)


def write_tiny_gguf(path: Path, arch: str) -> TinyGGUF:
    rng = np.random.default_rng(0 if arch == "qwen2" else 1)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    if arch == "llama":
        writer.add_rope_dimension_count(HEAD_DIM)
        vocab = _add_spm_tokenizer(writer)
    else:
        vocab = _add_gpt2_tokenizer(writer)
    tied = arch == "qwen2"  # cover both: qwen2 ties lm_head to the embedding, llama does not
    tiny = TinyGGUF(path, arch, vocab, tied)

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(gguf_name, hf_name, value, qtype, permute_heads=0):
        _add(writer, tiny, rng, gguf_name, hf_name, value, qtype, permute_heads)

    permute = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight", w(vocab, HIDDEN, scale=0.5), Q.Q8_0)
    if not tied:
        add("output.weight", "lm_head.weight", w(vocab, HIDDEN), Q.F16)
    add("output_norm.weight", "model.norm.weight", 1 + w(HIDDEN), Q.F32)
    for i in range(LAYERS):
        hf = f"model.layers.{i}"
        add(f"blk.{i}.attn_norm.weight", f"{hf}.input_layernorm.weight", 1 + w(HIDDEN), Q.F32)
        add(f"blk.{i}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", 1 + w(HIDDEN), Q.F32)
        add(f"blk.{i}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", w(HEADS * HEAD_DIM, HIDDEN), Q.Q8_0,
            HEADS if permute else 0)  # fmt: skip
        add(f"blk.{i}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", w(KV_HEADS * HEAD_DIM, HIDDEN),
            Q.BF16 if i == 0 else Q.F32, KV_HEADS if permute else 0)  # fmt: skip
        add(f"blk.{i}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", w(KV_HEADS * HEAD_DIM, HIDDEN), Q.Q5_0)
        add(f"blk.{i}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", w(HIDDEN, HEADS * HEAD_DIM), Q.F16)
        add(f"blk.{i}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", w(FFN, HIDDEN), Q.Q8_0)
        add(f"blk.{i}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", w(FFN, HIDDEN), Q.F16)
        add(f"blk.{i}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", w(HIDDEN, FFN),
            Q.Q4_K if i == 0 else Q.Q6_K)  # fmt: skip
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", f"{hf}.self_attn.q_proj.bias", w(HEADS * HEAD_DIM), Q.F32)
            add(f"blk.{i}.attn_k.bias", f"{hf}.self_attn.k_proj.bias", w(KV_HEADS * HEAD_DIM), Q.F32)
            add(f"blk.{i}.attn_v.bias", f"{hf}.self_attn.v_proj.bias", w(KV_HEADS * HEAD_DIM), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tiny


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def converted(request, tmp_path_factory):
    """(tiny gguf, float32 conversion dir) for each architecture."""
    root = tmp_path_factory.mktemp(request.param)
    tiny = write_tiny_gguf(root / f"tiny-{request.param}.gguf", request.param)
    out = convert_gguf(tiny.path, root / "hf", dtype="float32", progress=False)
    return tiny, out


# ---------------------------------------------------------------------------------------------
# Tensors


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_tensors_round_trip(converted):
    tiny, out = converted
    tensors = _load_safetensors(out / "model.safetensors")
    assert set(tensors) == set(tiny.expected)
    assert ("lm_head.weight" in tensors) == (not tiny.tied)
    for name, expected in tiny.expected.items():
        got = tensors[name].numpy()
        assert got.dtype == np.float32 and got.shape == expected.shape, name
        # Exact against the dequantized GGUF values (layout, naming, q/k un-permutation) ...
        np.testing.assert_array_equal(got, expected, err_msg=name)
        # ... and close to the unquantized originals (quantization tolerance).
        original = tiny.originals[name]
        if name in tiny.exact:
            np.testing.assert_array_equal(got, original, err_msg=name)
        else:
            assert np.abs(got - original).max() <= 0.05 * np.abs(original).max() + 1e-6, name


def test_llama_q_k_are_unpermuted_not_copied(tmp_path):
    """If the converter skipped the un-permutation, q/k would equal the GGUF row order."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    out = convert_gguf(tiny.path, tmp_path / "out", dtype="float32", progress=False)
    tensors = _load_safetensors(out / "model.safetensors")
    k = tensors["model.layers.1.self_attn.k_proj.weight"].numpy()  # F32 in the file: exact
    np.testing.assert_array_equal(k, tiny.originals["model.layers.1.self_attn.k_proj.weight"])
    assert not np.array_equal(k, _llama_cpp_permute(k, KV_HEADS))


def test_bfloat16_output(tmp_path):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    out = convert_gguf(tiny.path, tmp_path / "bf16", progress=False)  # default dtype
    tensors = _load_safetensors(out / "model.safetensors")
    for name, expected in tiny.expected.items():
        assert tensors[name].dtype == torch.bfloat16
        torch.testing.assert_close(tensors[name], torch.from_numpy(expected).to(torch.bfloat16), rtol=0, atol=0)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


# ---------------------------------------------------------------------------------------------
# Config, tokenizer


def test_config_fields(converted):
    tiny, out = converted
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM" if tiny.arch == "qwen2" else "LlamaForCausalLM"]
    assert config["model_type"] == tiny.arch
    assert config["hidden_size"] == HIDDEN
    assert config["intermediate_size"] == FFN
    assert config["num_hidden_layers"] == LAYERS
    assert config["num_attention_heads"] == HEADS
    assert config["num_key_value_heads"] == KV_HEADS
    assert config["rope_theta"] == ROPE_THETA
    assert config["rms_norm_eps"] == RMS_EPS  # float32 in the file, written as 1e-05
    assert config["vocab_size"] == tiny.vocab_size
    assert config["max_position_embeddings"] == CONTEXT
    assert config["tie_word_embeddings"] is tiny.tied
    generation = json.loads((out / "generation_config.json").read_text())
    if tiny.arch == "qwen2":
        assert (config["bos_token_id"], config["eos_token_id"]) == (264, 266)
        assert generation["eos_token_id"] == [266, 264]  # <|im_end|>, then <|endoftext|>
        assert generation["pad_token_id"] == 264
    else:
        assert config["head_dim"] == HEAD_DIM and config["attention_bias"] is False
        assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
        assert generation["eos_token_id"] == 2


def test_tokenizer(converted):
    from transformers import AutoTokenizer

    tiny, out = converted
    tok = AutoTokenizer.from_pretrained(out)
    if tiny.arch == "qwen2":
        ids = tok("def fib<|im_end|><tool_call> the")["input_ids"]
        assert tok.convert_ids_to_tokens(ids) == ["def", "\u0120fib", "<|im_end|>", "<tool_call>", "\u0120the"]
        assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [264, 265, 266]
        assert len(tok) == 268  # the [PAD..] fillers are not tokens
        assert tok.decode(ids, skip_special_tokens=True) == "def fib<tool_call> the"
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    else:
        ids = tok("hello world the")["input_ids"]
        assert ids[0] == 1  # add_bos_token
        assert tok.convert_ids_to_tokens(ids[1:]) == ["\u2581hello", "\u2581world", "\u2581the"]
        assert tok.decode(ids, skip_special_tokens=True) == "hello world the"
        assert tok.convert_ids_to_tokens(tok("hé")["input_ids"][1:]) == ["\u2581h", "<0xC3>", "<0xA9>"]


def test_tokenizer_matches_transformers_gguf_tokenizer(converted):
    from transformers import AutoTokenizer

    tiny, out = converted
    ours = AutoTokenizer.from_pretrained(out)
    try:
        reference = AutoTokenizer.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name)
    except Exception as exc:  # the GGUF path of transformers is optional; don't fail on it
        pytest.skip(f"transformers cannot build a tokenizer from this GGUF: {exc}")
    for text in ["def fib the", "hello world", "the\n\nhello  world", "héllo 123"]:
        assert ours(text)["input_ids"] == reference(text)["input_ids"], text


# ---------------------------------------------------------------------------------------------
# Loading with transformers


def _reference_model(tiny: TinyGGUF):
    """HF model built from our own knowledge of the tiny file, not from the converter's config."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=tiny.vocab_size, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CONTEXT,
        rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA, tie_word_embeddings=tiny.tied,
    )  # fmt: skip
    if tiny.arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(head_dim=HEAD_DIM, **common))
    state = {k: torch.from_numpy(v) for k, v in tiny.expected.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


def test_transformers_loads_and_logits_match_reference(converted):
    from transformers import AutoModelForCausalLM

    tiny, out = converted
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 40, 77, 120, 200, 3]])
    with torch.no_grad():
        got, want = model(ids).logits, _reference_model(tiny)(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_logits_match_transformers_gguf_loader(converted):
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
    from transformers import AutoModelForCausalLM

    tiny, out = converted
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 40, 77, 120, 200, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Failure behaviour


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    real = gguf_tensors.dequantized_blocks
    calls = {"n": 0}

    def flaky(job, head_dim):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(job, head_dim)

    monkeypatch.setattr("bass.app.models.gguf_convert.dequantized_blocks", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(tiny.path, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_refuses_to_replace_unrelated_directory(tmp_path):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ModelSetupError):
        convert_gguf(tiny.path, precious, progress=False, overwrite=True)
    assert (precious / "notes.txt").read_text() == "keep me"
    out = convert_gguf(tiny.path, tmp_path / "out", progress=False)
    with pytest.raises(ModelSetupError):  # a model dir, but overwrite not requested
        convert_gguf(tiny.path, out, progress=False)
    convert_gguf(tiny.path, out, progress=False, overwrite=True)


def test_unsupported_architecture(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFConversionError, match="architecture 'gpt2'"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_unknown_tensor_is_an_error():
    with pytest.raises(GGUFConversionError, match="rope_freqs"):
        gguf_tensors.hf_tensor_name("rope_freqs.weight")
    with pytest.raises(GGUFConversionError):
        gguf_tensors.hf_tensor_name("blk.0.attn_qkv.weight")


def test_convert_command(tmp_path):
    from click.testing import CliRunner

    from bass.app.models.commands import convert_gguf_command

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    runner = CliRunner()
    result = runner.invoke(convert_gguf_command, [str(tiny.path), str(tmp_path / "out"), "--dtype", "float16"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("converted ") and "(float16)" in result.stdout
    assert result.stdout.count("\n") == 1  # one-line summary; progress went to stderr
    again = runner.invoke(convert_gguf_command, [str(tiny.path), str(tmp_path / "out")])
    assert again.exit_code == 1 and "not empty" in again.stderr
