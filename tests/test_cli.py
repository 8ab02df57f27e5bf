"""`bass generate` as a user runs it: a subprocess printing one JSON object."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from bass.cli import main
from bass.coordinator.requests import GenerationRequest
from conftest import build_scheduler


def bass(*args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "bass.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_generate_json_speculative_matches_regular(llama_target, llama_draft):
    common = ["--target", llama_target, "--prompt-ids", "5,17,33", "-n", "2", "--max-new-tokens", "10", "--json"]
    spec = bass("generate", *common, "--draft", llama_draft, "--draft-length", "bass")
    assert spec.returncode == 0, spec.stderr
    out = json.loads(spec.stdout)
    assert [s["index"] for s in out["sequences"]] == [0, 1]
    for s in out["sequences"]:
        assert s["finish_reason"] in ("stop", "length") and isinstance(s["text"], str)
    stats = out["stats"]
    assert stats["mode"] == "speculative" and stats["draft_tokens"] > 0
    assert 0 <= stats["acceptance_rate"] <= 1 and stats["steps"] >= 1 and stats["wall_time_s"] > 0

    regular = json.loads(bass("generate", *common, "--draft", llama_draft, "--draft-length", "0").stdout)
    assert regular["stats"]["mode"] == "regular" and regular["stats"]["draft_tokens"] == 0
    assert [s["token_ids"] for s in regular["sequences"]] == [s["token_ids"] for s in out["sequences"]]

    (expected,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=(5, 17, 33), max_new_tokens=10)])
    assert out["sequences"][0]["token_ids"] == expected.sequences[0].token_ids


def test_generate_text_prompt_sampling_with_seed_is_reproducible(llama_target, llama_draft):
    args = ["generate", "--target", llama_target, "--draft", llama_draft, "--prompt", "def fibonacci(n):",
            "--temperature", "0.8", "--top-p", "0.95", "--seed", "7", "--max-new-tokens", "8", "--json"]
    a, b = bass(*args), bass(*args)
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["sequences"] == json.loads(b.stdout)["sequences"]


def test_bad_input_is_a_usage_error_naming_the_field(llama_target):
    r = bass("generate", "--target", llama_target, "--prompt-ids", "5,17", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = bass("generate", "--target", llama_target, "--prompt-ids", "5,x")
    assert r.returncode == 2 and "comma-separated integers" in r.stderr
    r = bass("generate", "--target", llama_target)
    assert r.returncode == 2 and "prompt" in r.stderr


def test_a_config_file_without_device_or_dtype_means_auto(llama_target, tmp_path, monkeypatch):
    """A [target] section that names only its model must not pin the model to the CPU in
    float32 on a GPU machine: device and dtype default to "auto", resolved where it runs."""
    import torch

    from bass.core.config import ServeConfig, WorkerServiceConfig, load_config_file

    path = tmp_path / "bass.toml"
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\n')
    cfg = load_config_file(path, ServeConfig)
    assert (cfg.target.device, cfg.target.dtype) == ("auto", "auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    runner = cfg.target.runner_config()
    assert (runner.device, runner.dtype) == ("cuda", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (cfg.target.runner_config().device, cfg.target.runner_config().dtype) == ("cpu", "float32")
    with pytest.raises(Exception, match="device"):
        WorkerServiceConfig(model_dir=llama_target, device="tpu")


def test_the_prefill_budget_is_validated_and_read_from_a_config_file(tmp_path):
    from bass.core.config import SchedulerConfig, load_config_file
    from bass.core.errors import InvalidRequestError

    assert SchedulerConfig().max_prefill_tokens_per_step == 512
    for bad in (0, -3, True, 2.5, "64"):
        with pytest.raises(InvalidRequestError, match="max_prefill_tokens_per_step"):
            SchedulerConfig(max_prefill_tokens_per_step=bad)
    path = tmp_path / "bass.toml"
    path.write_text("[coordinator.scheduler]\nmax_prefill_tokens_per_step = 64\n")
    assert load_config_file(path).coordinator.scheduler.max_prefill_tokens_per_step == 64
    path.write_text("[coordinator.scheduler]\nmax_prefill_tokens_per_step = 0\n")
    with pytest.raises(InvalidRequestError, match="max_prefill_tokens_per_step"):
        load_config_file(path)


def test_int8_weights_are_a_drafts_option_read_from_a_config_file(llama_target, tmp_path):
    """int8 weights change a model's numbers: for the draft (whose proposals verification
    checks), refused for the target (whose numbers are the output) and beside batch_invariant."""
    from bass.core.config import RunnerConfig, load_config_file
    from bass.core.errors import InvalidRequestError

    path = tmp_path / "bass.toml"
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\n[draft]\nmodel_dir = "{llama_target}"\n'
                    "int8_weights = true\n")
    cfg = load_config_file(path)
    assert cfg.draft.runner_config().int8_weights is True
    target = cfg.target.runner_config()
    assert target.int8_weights is None and target.as_draft().int8_weights is True  # "auto": a draft's only
    assert RunnerConfig(model_dir=llama_target, int8_weights=False).as_draft().int8_weights is False
    assert RunnerConfig(model_dir=llama_target, batch_invariant=True).as_draft().int8_weights is False
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\nint8_weights = true\n')
    with pytest.raises(InvalidRequestError, match="target.int8_weights.*draft only"):
        load_config_file(path)
    with pytest.raises(InvalidRequestError, match="int8_weights"):
        RunnerConfig(model_dir=llama_target, int8_weights=True, batch_invariant=True)


def test_few_row_cuda_is_on_for_both_models_unless_a_section_turns_it_off(llama_target, tmp_path):
    from bass.core.config import load_config_file

    path = tmp_path / "bass.toml"
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\n[draft]\nmodel_dir = "{llama_target}"\n')
    cfg = load_config_file(path)
    assert cfg.target.runner_config().few_row_cuda is True and cfg.draft.runner_config().as_draft().few_row_cuda is True
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\nfew_row_cuda = false\n'
                    f'[draft]\nmodel_dir = "{llama_target}"\n')
    cfg = load_config_file(path)
    assert cfg.target.runner_config().few_row_cuda is False
    assert cfg.draft.runner_config().as_draft().few_row_cuda is True


def test_programmatic_launch_is_on_by_default_and_a_config_key_turns_it_off(llama_target, tmp_path):
    from bass.core.config import RunnerConfig, load_config_file

    path = tmp_path / "bass.toml"
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\nprogrammatic_launch = false\n'
                    f'[draft]\nmodel_dir = "{llama_target}"\n')
    cfg = load_config_file(path)
    assert cfg.target.runner_config().programmatic_launch is False
    assert cfg.draft.runner_config().as_draft().programmatic_launch is True
    assert RunnerConfig(model_dir=llama_target).programmatic_launch is True
    path.write_text(f'[target]\nmodel_dir = "{llama_target}"\nprogrammatic_launch = "sometimes"\n')
    with pytest.raises(Exception, match="programmatic_launch"):
        load_config_file(path)


@pytest.mark.parametrize("command", ["acceptance", "acceptance-rules", "invariance"])
def test_bench_commands_name_an_unknown_sampling_mode(command, llama_target):
    result = CliRunner().invoke(main, ["bench", command, "--target", str(llama_target), "--draft", str(llama_target),
                                       "--modes", "greedy,t9", "--device", "cpu"])
    assert result.exit_code == 2 and "unknown modes ['t9']" in result.output
