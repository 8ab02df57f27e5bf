"""`bass serve` and `bass client` as a user runs them: real processes, real ports, signals."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bass.coordinator.requests import GenerationRequest
from conftest import build_scheduler
from test_metrics import scrape


def bass_cmd(*args):
    return [sys.executable, "-m", "bass.cli", *map(str, args)]


def read_ready_lines(proc, timeout_s=180):
    """{service: its ready message} from bass serve's stdout, once the coordinator serves."""
    ready, deadline = {}, time.monotonic() + timeout_s
    while "coordinator" not in ready:
        assert time.monotonic() < deadline, "services did not start"
        line = proc.stdout.readline()
        assert line, f"bass serve exited early with {proc.poll()}"
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        ready[msg["service"]] = msg
    return ready


def children_of(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("separate", [False, True])
def test_serve_then_client_then_stop_together(llama_target, llama_draft, tmp_path, separate):
    """By default the draft runs in the target's process (two children, one worker address);
    --separate-draft gives it one of its own."""
    config = tmp_path / "bass.toml"
    config.write_text('[coordinator]\nport = 0\nmax_waiting = 8\n[coordinator.scheduler.draft_length]\npolicy = "fixed"\n'
                      'fixed = 3\n[target]\nnum_slots = 8\nmax_seq_len = 256\n[draft]\nnum_slots = 8\nmax_seq_len = 256\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(bass_cmd("serve", "--target", llama_target, "--draft", llama_draft, "--device", "cpu",
                                     "--config", config, "--metrics-port", 0, *(["--separate-draft"] if separate else [])),
                            stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        ready = read_ready_lines(proc)
        addresses = {service: msg["address"] for service, msg in ready.items()}
        assert set(addresses) == {"target", "draft", "coordinator"}
        children = children_of(proc.pid)
        assert len(children) == (3 if separate else 2)
        assert (addresses["target"] == addresses["draft"]) is not separate

        out = subprocess.run(bass_cmd("client", "--address", addresses["coordinator"], "--prompt-ids", "5,17,33",
                                      "-n", "2", "--max-new-tokens", "12", "--json"),
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        response = json.loads(out.stdout)
        (expected,) = build_scheduler(llama_target, None).generate(
            [GenerationRequest(prompt_ids=(5, 17, 33), max_new_tokens=12)])
        assert [s["tokenIds"] for s in response["sequences"]] == [expected.sequences[0].token_ids] * 2
        assert int(response["stats"]["draftTokens"]) > 0

        bad = subprocess.run(bass_cmd("client", "--address", addresses["coordinator"], "--prompt-ids", "5",
                                      "--temperature", "-2"), capture_output=True, text=True, env=env, timeout=60)
        assert bad.returncode != 0 and "INVALID_ARGUMENT: temperature" in bad.stderr

        metrics = scrape(ready["coordinator"]["metrics"])
        assert metrics[("bass_requests_total", (("outcome", "ok"),))] == 1
        assert metrics[("bass_requests_total", (("outcome", "rejected"),))] == 1
        assert metrics[("bass_generated_tokens_total", ())] == 24
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    time.sleep(0.5)
    assert all(not os.path.exists(f"/proc/{pid}") for pid in children), "a service outlived bass serve"


def test_serve_reports_a_missing_model(tmp_path):
    out = subprocess.run(bass_cmd("serve", "--target", tmp_path, "--draft", "none", "--device", "cpu"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no target model" in out.stderr


def test_target_service_with_a_draft_serves_both_from_one_process(llama_target, llama_draft):
    """`bass target-service --draft DIR` (what `bass serve` starts by default): both worker
    services on one port, one instance id, the draft on the target's device; SIGTERM stops it."""
    from bass.transport.remote import RemoteDraftWorker, RemoteTargetWorker

    proc = subprocess.Popen(bass_cmd("target-service", "--model", llama_target, "--draft", llama_draft,
                                     "--device", "cpu", "--num-slots", 4, "--max-seq-len", 128, "--port", 0),
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = json.loads(proc.stdout.readline())
        assert line["service"] == "target"
        d = RemoteDraftWorker(line["address"])
        t = RemoteTargetWorker(line["address"], draft=d)
        target_info, draft_info = t.info(), d.info()
        assert target_info.instance_id == draft_info.instance_id and t.verifies_device_drafts
        assert draft_info.device == target_info.device == "cpu" and draft_info.num_slots == 4
        t.close()
        d.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_target_service_reports_a_draft_directory_without_a_model(llama_target, tmp_path):
    out = subprocess.run(bass_cmd("target-service", "--model", llama_target, "--draft", tmp_path, "--device", "cpu"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and str(tmp_path) in out.stderr, out.stderr[-2000:]


def test_two_gpu_flags_and_keys_reach_the_config(llama_target, llama_draft, tmp_path):
    """--draft-device puts the draft on a GPU of its own, in a process of its own ([draft] device
    in a config file with colocate = false does too); both as `bass serve` reads them (no CUDA
    needed to build the config)."""
    from bass.app.cli.serve import serve, serve_config

    base = ["--target", llama_target, "--draft", llama_draft, "--device", "cuda"]
    cfg = serve_config(serve.make_context("serve", [*map(str, base), "--draft-device", "cuda:1"]))
    assert (cfg.target.device, cfg.draft.device, cfg.colocate) == ("cuda", "cuda:1", False)  # its own process
    config = tmp_path / "two-gpus.toml"
    config.write_text('colocate = false\n[draft]\ndevice = "cuda:1"\n')
    cfg = serve_config(serve.make_context("serve", [*map(str, base), "--config", str(config)]))
    assert (cfg.target.device, cfg.draft.device, cfg.colocate) == ("cuda", "cuda:1", False)
    assert serve_config(serve.make_context("serve", list(map(str, base)))).draft.device == "cuda"  # the target's
    same = serve_config(serve.make_context("serve", [*map(str, base), "--draft-device", "cuda:0"]))
    assert same.colocate, "cuda:0 is the target's 'cuda': the draft stays in the target's process"


def test_a_draft_on_its_own_gpu_taking_turns_is_advised_against(llama_target, llama_draft):
    """The draft on a second GPU with streamed speculation off runs every step through the host
    (slower than one GPU): `bass serve` says so and names the two ways that use a second GPU;
    with streaming on, on one GPU, or with the draft apart on the target's own GPU, it says
    nothing."""
    from bass.app.cli.serve import serve, serve_config
    from bass.app.launcher import draft_on_own_gpu

    def advice(*flags):
        base = ["--target", llama_target, "--draft", llama_draft, "--device", "cuda"]
        config = serve_config(serve.make_context("serve", [*map(str, base), *flags]))
        return config.turn_taking_warning(draft_on_own_gpu(config))

    text = advice("--draft-device", "cuda:1")
    assert text is not None and "--replicas 2" in text and "--draft-stream" in text
    assert advice("--draft-device", "cuda:1", "--draft-stream", "6") is None
    assert advice() is None
    assert advice("--separate-draft") is None  # its own process, the target's GPU: not two GPUs
    assert advice("--draft-device", "cuda:0") is None


def test_streamed_speculation_flag_and_keys_reach_the_config(llama_target, llama_draft, tmp_path):
    """--draft-stream K turns on streamed speculation (the draft drafting ahead on its own GPU);
    its other settings come from [coordinator.scheduler.draft_stream], which the flag keeps."""
    from bass.app.cli.serve import serve, serve_config

    base = ["--target", llama_target, "--draft", llama_draft, "--device", "cuda", "--draft-device", "cuda:1"]
    cfg = serve_config(serve.make_context("serve", [*map(str, base), "--draft-stream", "6"]))
    assert cfg.coordinator.scheduler.draft_stream.block == 6 and not cfg.colocate
    config = tmp_path / "stream.toml"
    config.write_text("[coordinator.scheduler.draft_stream]\nblock = 4\nchunk = 2\nlookahead = 12\nmax_batch = 8\n")
    stream = serve_config(serve.make_context("serve", [*map(str, base), "--config", str(config)])
                          ).coordinator.scheduler.draft_stream
    assert (stream.block, stream.chunk, stream.lookahead, stream.max_batch) == (4, 2, 12, 8)
    stream = serve_config(serve.make_context("serve", [*map(str, base), "--config", str(config),
                                                       "--draft-stream", "5"])).coordinator.scheduler.draft_stream
    assert (stream.block, stream.chunk, stream.lookahead) == (5, 2, 12)


def test_a_bad_stream_block_is_named(llama_target, llama_draft):
    proc = subprocess.run(bass_cmd("serve", "--target", llama_target, "--draft", llama_draft, "--device", "cpu",
                                   "--draft-stream", "99"), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "draft_stream.block" in proc.stderr and "got 99" in proc.stderr, proc.stderr


def test_streamed_speculation_with_a_colocated_draft_is_named(llama_target, llama_draft):
    """--draft-stream without a draft process of its own would stream between two models in one
    process on one device: a config error that says what to set."""
    proc = subprocess.run(bass_cmd("serve", "--target", llama_target, "--draft", llama_draft, "--device", "cpu",
                                   "--draft-stream", "4"), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "draft_stream.block" in proc.stderr and "--draft-device" in proc.stderr, proc.stderr


def test_the_lookup_tail_reaches_the_target(llama_target, llama_draft, tmp_path):
    """--lookup-tail M (and [target] lookup_tail) set the target's option, on by default (2);
    out of range it is a config error that names the key."""
    from bass.app.cli.serve import serve, serve_config
    from bass.core.config import DEFAULT_LOOKUP_TAIL
    from bass.core.errors import InvalidRequestError

    base = [*map(str, ["--target", llama_target, "--draft", llama_draft, "--device", "cpu"])]
    assert serve_config(serve.make_context("serve", [*base, "--lookup-tail", "0"])).target.lookup_tail == 0
    config = tmp_path / "tail.toml"
    config.write_text("[target]\nlookup_tail = 1\n")
    assert serve_config(serve.make_context("serve", [*base, "--config", str(config)])).target.lookup_tail == 1
    assert serve_config(serve.make_context("serve", base)).target.lookup_tail == DEFAULT_LOOKUP_TAIL == 6
    with pytest.raises(InvalidRequestError, match="lookup_tail.*got 7"):
        serve_config(serve.make_context("serve", [*base, "--lookup-tail", "7"]))
