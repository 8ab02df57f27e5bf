"""`bass serve --replicas 2` as a user runs it: real processes on the CPU over tiny models, the
router in front of two replicas; routing by load, a request's n sequences on one replica, a
replica's coordinator killed mid-stream and a replica's model process killed, each started
again and rejoining the router."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from bass.app.client import BassClient, build_request
from bass.coordinator.requests import GenerationRequest
from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc
from conftest import build_scheduler
from services import run_at_once
from test_metrics import scrape
from test_serve_cli import bass_cmd, children_of

PROMPT = (5, 17, 33)


def read_until_router(proc, timeout_s=240) -> list[dict]:
    lines, deadline = [], time.monotonic() + timeout_s
    while not any(m["service"] == "router" for m in lines):
        assert time.monotonic() < deadline, "services did not start"
        line = proc.stdout.readline()
        assert line, f"bass serve exited early with {proc.poll()}"
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def listening_pid(port: int, pids: list[int]) -> int:
    """Which of pids listens on the TCP port (from /proc: the socket's inode among its fds)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # 0A: LISTEN
                inodes.add(cols[9])
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return pid
    raise AssertionError(f"no process of {pids} listens on {port}")


def load(address: str) -> pb.LoadResponse:
    with grpc.insecure_channel(address) as channel:
        return generation_pb2_grpc.ReplicaStub(channel).Load(pb.LoadRequest(), timeout=5)


def wait_until(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except (grpc.RpcError, OSError, KeyError):
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def served_by(metrics_address: str, replicas: list[str]) -> list[float]:
    m = scrape(metrics_address)
    return [m.get(("bass_router_requests_total", (("code", "ok"), ("replica", r))), 0) for r in replicas]


@pytest.fixture(scope="module")
def expected(llama_target):
    (r,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=PROMPT, max_new_tokens=12, ignore_eos=True)])
    return list(r.sequences[0].token_ids)


def test_two_replicas_behind_the_router(llama_target, llama_draft, tmp_path, expected):
    config = tmp_path / "bass.toml"
    config.write_text('replicas = 2\n[router]\npoll_interval_s = 0.05\n'
                      '[coordinator]\nport = 0\nreconnect_interval_s = 0.2\n'
                      '[coordinator.scheduler.draft_length]\npolicy = "fixed"\nfixed = 3\n'
                      '[target]\nnum_slots = 8\nmax_seq_len = 512\n[draft]\nnum_slots = 8\nmax_seq_len = 512\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(bass_cmd("serve", "--target", llama_target, "--draft", llama_draft, "--device", "cpu",
                                     "--config", config, "--metrics-port", 0),
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = read_until_router(proc)
        router = next(m for m in lines if m["service"] == "router")
        replicas = [m["address"] for m in sorted((m for m in lines if m["service"] == "replica"),
                                                 key=lambda m: m["replica"])]
        assert len(replicas) == 2 and len(set(replicas)) == 2
        assert len(children_of(proc.pid)) == 5  # two model processes (draft in the target's), two coordinators, router
        address, metrics = router["address"], router["metrics"]

        # A request of 3 sequences is split over the two idle replicas (router.split_min_sequences),
        # each sequence's text what the target alone gives.
        with BassClient(address, timeout_s=120) as c:
            reply = c.generate(list(PROMPT), n=3, max_new_tokens=12, ignore_eos=True)
        assert [s.index for s in reply.sequences] == [0, 1, 2]
        assert [list(s.token_ids) for s in reply.sequences] == [expected] * 3
        assert served_by(metrics, replicas) == [1, 1]
        assert scrape(metrics)[("bass_router_split_requests_total", (("parts", "2"),))] == 1

        # By load: while one replica runs a long stream, short requests go to the other.
        with BassClient(address, timeout_s=120) as c:
            long = c.stub.GenerateStream(build_request(list(PROMPT), max_new_tokens=400, ignore_eos=True),
                                         timeout=120)
            next(long)  # it runs
            busy = next(r for r in replicas if load(r).running_sequences == 1)
            idle = next(r for r in replicas if r != busy)
            before = served_by(metrics, [busy, idle])
            for _ in range(3):
                assert list(c.generate(list(PROMPT), max_new_tokens=12, ignore_eos=True).sequences[0].token_ids) \
                    == expected
            after = served_by(metrics, [busy, idle])
            assert [a - b for a, b in zip(after, before)] == [0, 3]

            # The busy replica's coordinator is killed mid-stream: that stream alone fails, UNAVAILABLE ...
            victim = listening_pid(int(busy.rpartition(":")[2]), children_of(proc.pid))
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                for _ in long:
                    pass
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            # ... and new requests are served by the other one at once.
            results = []
            for _ in range(4):
                results.append(list(c.generate(list(PROMPT), max_new_tokens=12, ignore_eos=True).sequences[0].token_ids))
            assert results == [expected] * 4
            assert time.monotonic() - killed < 60
            assert scrape(metrics)[("bass_replica_up", (("replica", busy),))] == 0

            # bass serve starts it again on its address; the router takes it back without a restart.
            wait_until(lambda: scrape(metrics)[("bass_replica_up", (("replica", busy),))] == 1, timeout_s=120)
            assert victim not in children_of(proc.pid) and len(children_of(proc.pid)) == 5
            before = served_by(metrics, [busy])[0]
            for _ in range(4):  # equal loads take turns
                c.generate(list(PROMPT), max_new_tokens=4)
            assert served_by(metrics, [busy])[0] > before

            # The other replica's model process (target with its draft) is killed: its coordinator
            # stays up but says it is not serving, so requests go to the first one; bass serve
            # starts the models again, the coordinator reconnects, the router takes it back.
            model = next(m for m in lines if m["service"] == "target" and m["replica"] == replicas.index(idle))
            victim = listening_pid(int(model["address"].rpartition(":")[2]), children_of(proc.pid))
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: not load(idle).serving, timeout_s=30)
            before = served_by(metrics, [busy, idle])
            for _ in range(3):
                assert list(c.generate(list(PROMPT), max_new_tokens=12, ignore_eos=True).sequences[0].token_ids) \
                    == expected
            after = served_by(metrics, [busy, idle])
            assert [a - b for a, b in zip(after, before)] == [3, 0]
            wait_until(lambda: scrape(metrics)[("bass_replica_up", (("replica", idle),))] == 1, timeout_s=120)
            assert load(idle).serving and len(children_of(proc.pid)) == 5

        # Concurrent requests all complete with the right text.
        outs, errors = [], []

        def one(_):
            try:
                with BassClient(address, timeout_s=120) as c:
                    outs.append(list(c.generate(list(PROMPT), max_new_tokens=12, ignore_eos=True).sequences[0].token_ids))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        run_at_once(one, 6)
        assert not errors and outs == [expected] * 6
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0


def test_bench_serve_through_two_replicas(llama_target, llama_draft, tmp_path):
    """`bass bench serve --serve --replicas 2` (what bench/gpu/runs/replicas.sh measures, in
    small): the load goes through the router, and every answer under load equals the same
    request sent alone, whichever replica ran either."""
    out = tmp_path / "out"
    proc = subprocess.run(
        bass_cmd("bench", "serve", "--serve", "--replicas", 2, "--target", llama_target, "--draft", llama_draft,
                 "--device", "cpu", "--num-slots", 8, "--max-seq-len", 1024, "--draft-length", 3,
                 "--rates", "inf", "--num-requests", 8, "--problems", "0:4", "--max-new-tokens", 8,
                 "--no-progress", "--out", out),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "serve.json").read_text())
    assert result["server"]["replicas"] == 2
    (run,) = result["runs"]
    assert run["completed"] == 8 and run["correctness"]["mismatches"] == 0
    assert '"service": "router"' in proc.stderr and proc.stderr.count('"service": "replica"') == 2
