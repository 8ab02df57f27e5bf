"""`bass up` / `bass down` as a user runs them, against a local Ray started by `bass up`."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from bass.app.client import BassClient  # noqa: E402
from ports import fixed_port  # noqa: E402


def _local_ray_running() -> bool:
    """A Ray head on this machine's default port (6379): `bass up` would fail to start its own,
    and `bass down --stop-ray` (`ray stop`) would stop it."""
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", 6379)) == 0


def test_up_then_down_with_a_local_ray(llama_target, llama_draft, tmp_path):
    if _local_ray_running():
        pytest.skip("a Ray head already runs on this machine: this test would stop it (bass down --stop-ray)")
    config = tmp_path / "bass.toml"
    config.write_text(f"""
[target]
device = "cpu"
num_slots = 4
max_seq_len = 256
[draft]
device = "cpu"
num_slots = 4
max_seq_len = 256
[coordinator]
port = {fixed_port()}
[ray]
namespace = "bass-cli-test"
target_gpus = 0.5
draft_gpus = 0.5
target_cpus = 0.5
draft_cpus = 0.5
coordinator_cpus = 0.5
target_port = {fixed_port()}
draft_port = {fixed_port()}
""")
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    bass = [sys.executable, "-m", "bass.cli"]
    try:
        up = subprocess.run(bass + ["up", "--config", str(config), "--target", str(llama_target), "--draft",
                                    str(llama_draft), "--num-gpus", "1"],
                            capture_output=True, text=True, timeout=300, env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        addresses = {m["service"]: m["address"] for m in map(json.loads, up.stdout.splitlines())}
        with BassClient(addresses["coordinator"], timeout_s=60) as client:
            r = client.generate([5, 17, 33], max_new_tokens=8, ignore_eos=True)
        assert len(r.sequences[0].token_ids) == 8 and r.stats.draft_tokens > 0
    finally:
        down = subprocess.run(bass + ["down", "--namespace", "bass-cli-test", "--stop-ray"], capture_output=True,
                              text=True, timeout=120, env=env)
    assert down.returncode == 0, down.stderr[-2000:]
    assert "coordinator" in down.stdout
