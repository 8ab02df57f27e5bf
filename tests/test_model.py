"""Our transformer against Hugging Face transformers, and ragged batching against single runs."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from bass.core.config import RunnerConfig
from bass.core.worker_api import AddSequence
from bass.engine.runner import ModelRunner

PROMPTS = [[5, 17, 33, 200, 7, 9, 11], [42], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [100, 101]]


@pytest.fixture(params=["llama", "qwen2"])
def target_dir(request, llama_target, qwen_target):
    return {"llama": llama_target, "qwen2": qwen_target}[request.param]


def hf_logits(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_prefill_logits_match_transformers(target_dir):
    runner = ModelRunner(RunnerConfig(model_dir=target_dir, num_slots=2, max_seq_len=64))
    ids = PROMPTS[2]
    runner.add([AddSequence(1, tuple(ids[:1]))])
    state = runner.get(1)
    runner.commit(state, ids[1:])
    ours = runner.forward([(state, [])], [len(ids)])  # logits at every position
    torch.testing.assert_close(ours, hf_logits(target_dir, ids), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ["pad", "split"])
def test_ragged_batch_equals_sequences_run_alone(target_dir, attention):
    """Mixed prefill chunks, single tokens and multi-token chunks in one forward."""
    cfg = RunnerConfig(model_dir=target_dir, num_slots=8, max_seq_len=64, attention=attention)
    alone = []
    for i, ids in enumerate(PROMPTS):
        r = ModelRunner(cfg)
        r.add([AddSequence(i, tuple(ids))])
        alone.append(r.forward([(r.get(i), [7, 8, 9])], [4]))
    batched = ModelRunner(cfg)
    batched.add([AddSequence(i, tuple(ids)) for i, ids in enumerate(PROMPTS)])
    out = batched.forward([(batched.get(i), [7, 8, 9]) for i in range(len(PROMPTS))], [4] * len(PROMPTS))
    torch.testing.assert_close(out, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_rollback_then_rerun_gives_same_logits(target_dir):
    """Speculative tokens written to the cache and rolled back must leave no trace."""
    r = ModelRunner(RunnerConfig(model_dir=target_dir, num_slots=2, max_seq_len=64))
    r.add([AddSequence(1, (5, 6, 7))])
    s = r.get(1)
    first = r.forward([(s, [40, 41, 42])], [4])
    r.commit(s, [40, 99])  # accepted 40, then a correction: 41 and 42 are rolled back
    assert r.cache.tokens(s.slot) == [5, 6, 7, 40]
    again = r.forward([(s, [11])], [2])
    fresh = ModelRunner(RunnerConfig(model_dir=target_dir, num_slots=2, max_seq_len=64))
    fresh.add([AddSequence(1, (5, 6, 7, 40, 99, 11))])
    expected = fresh.forward([(fresh.get(1), [])], [1])
    torch.testing.assert_close(again[-1:], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first[:1], hf_logits(target_dir, [5, 6, 7])[-1:], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_tracks_fp32(llama_target, dtype):
    ids = PROMPTS[0]
    out = {}
    for dt in ("float32", dtype):
        r = ModelRunner(RunnerConfig(model_dir=llama_target, num_slots=1, max_seq_len=32, dtype=dt))
        r.add([AddSequence(1, tuple(ids))])
        out[dt] = r.forward([(r.get(1), [])], [1])
    assert out[dtype].dtype == torch.float32
    assert (out[dtype] - out["float32"]).abs().max() < 0.1
    assert out[dtype].argmax() == out["float32"].argmax()


def test_sharded_checkpoint_loads_the_same(llama_target, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(str(llama_target))
    model.save_pretrained(str(tmp_path), max_shard_size="40KB")
    for f in llama_target.glob("tokenizer*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    out = []
    for d in (llama_target, tmp_path):
        r = ModelRunner(RunnerConfig(model_dir=d, num_slots=1, max_seq_len=32))
        r.add([AddSequence(1, tuple(PROMPTS[0]))])
        out.append(r.forward([(r.get(1), [])], [1]))
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=1e-5)


def test_missing_model_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ModelRunner(RunnerConfig(model_dir=tmp_path))
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelRunner(RunnerConfig(model_dir=tmp_path))
