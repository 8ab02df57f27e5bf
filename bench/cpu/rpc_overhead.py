"""Per-call transport overhead between the coordinator and a worker, on any machine (issue #13).

A worker process serves bass.v1.TargetWorker through the real servicer and server set-up, over
a stand-in worker whose Verify takes a fixed time T, like a GPU step: `sleep` (the worker's
thread blocks, as when CUDA syncs by blocking) or `busy` (the core stays busy without holding
the GIL, as when CUDA syncs by spinning). A client in this process sends a batch-8, k = 4
Verify per call, one at a time like the coordinator's loop, and counts wall time minus the
worker's reported compute_s as overhead; CPU seconds of both processes per call are counted too.
Each client is measured at each T over TCP (127.0.0.1) and over a Unix socket.

    .venv/bin/python bench/cpu/rpc_overhead.py [--t-ms 1,3,10] [--calls 300] [--out FILE]
    .venv/bin/python bench/cpu/rpc_overhead.py serve --t-ms 3 --work sleep --address ADDR  # one worker

Clients: `unary` (one Verify RPC per call: the transport before issue #13), `unary-spin` (the
same, its reply awaited by polling the future without sleeping for up to 2 ms), `session`
(bass.transport.remote's stream transport, which `bass serve` uses) and `session-ahead` (the
same with one call kept in flight, as regular decoding runs). `period_overhead_ms` is the wall
time per call beyond T: for `session-ahead` what the worker idles between calls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAIN_PID = os.getpid()


# -- the worker side ---------------------------------------------------------------------------------
class _Cache:
    free_slots = 64


class _Runner:
    sequences: dict = {}
    cache = _Cache()


class TimedTargetWorker:
    """Answers Verify after `t_s` of `work` ("sleep" or "busy"); enough of a TargetWorker for the servicer."""

    runner = _Runner()

    def __init__(self, t_s: float, work: str):
        self.t_s, self.work = t_s, work
        self._chunk = bytes(1 << 15)  # hashing 32 KiB releases the GIL and takes ~20 us

    def info(self):
        from bass.core.worker_api import WorkerInfo
        return WorkerInfo("timed", 1000, 64, 1024, "float32", "cpu")

    def verify(self, request):
        from bass.core.worker_api import Verdict, VerifyResponse
        started = time.perf_counter()
        end = started + self.t_s
        if self.work == "sleep":
            time.sleep(self.t_s)
        else:
            while time.perf_counter() < end:
                hashlib.sha256(self._chunk).digest()
        verdicts = [Verdict(accepted=len(i.draft_tokens), tokens=[*i.draft_tokens, 7]) for i in request.items]
        return VerifyResponse(verdicts=verdicts, compute_s=time.perf_counter() - started)

    def release(self, seq_ids):
        pass

    def reset(self):
        pass


def serve(t_ms: float, work: str, address: str) -> None:
    from bass.transport.grpc_server import start_server, wait_for_stop_signal
    from bass.target_service.servicer import SERVICE_NAME, TargetServicer

    servicer = TargetServicer(TimedTargetWorker(t_ms / 1000, work))
    host, _, port = address.rpartition(":") if not address.startswith("unix:") else (address, "", "")
    if address.startswith("unix:"):
        running = start_server([servicer.register], [SERVICE_NAME], host=address, port=None)
    else:
        running = start_server([servicer.register], [SERVICE_NAME], host=host, port=int(port))
    print(json.dumps({"address": address if address.startswith("unix:") else f"{host}:{running.port}"}), flush=True)
    wait_for_stop_signal()
    running.stop(0)


class WorkerProcess:
    def __init__(self, t_ms: float, work: str, address: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", "--t-ms", str(t_ms), "--work", work,
                                      "--address", address], stdout=subprocess.PIPE, text=True)
        self.address = json.loads(self.proc.stdout.readline())["address"]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- the client side ---------------------------------------------------------------------------------
def verify_request(batch: int = 8, k: int = 4):
    from bass.core.config import SamplingParams
    from bass.core.worker_api import SequenceSampling, VerifyItem, VerifyRequest
    sampling = SequenceSampling(SamplingParams(), seed_key=12345)
    return VerifyRequest(items=[VerifyItem(i + 1, tuple(range(100, 100 + k)), sampling) for i in range(batch)])


class UnarySpin:
    """One unary Verify per call whose reply is polled for up to `spin_s` before blocking."""

    def __init__(self, address: str, spin_s: float = 0.002):
        import grpc
        from bass.transport.grpc_server import SERVER_OPTIONS
        from bass.v1 import worker_pb2_grpc
        self.channel = grpc.insecure_channel(address, options=SERVER_OPTIONS)
        self.stub = worker_pb2_grpc.TargetWorkerStub(self.channel)
        self.spin_s = spin_s

    def verify(self, request):
        from bass.transport import wire
        future = self.stub.Verify.future(wire.verify_request_to_proto(request), timeout=60)
        end = time.perf_counter() + self.spin_s
        while not future.done() and time.perf_counter() < end:
            time.sleep(0)  # releases the GIL: gRPC's threads must run to complete the call
        return wire.verify_response_from_proto(future.result())

    def close(self):
        self.channel.close()


class SessionAhead:
    """The session with one call kept in flight, as regular decoding runs (coordinator/regular_pipeline.py):
    each `verify` sends the next call, then waits for the previous one's answer."""

    def __init__(self, address: str):
        from bass.coordinator import remote
        self.worker = remote.RemoteTargetWorker(address, transport="session")
        self.in_flight = None

    def verify(self, request):
        if self.in_flight is None:  # the first call primes the pipeline
            self.in_flight = self.worker.start_verify(request)
        previous, self.in_flight = self.in_flight, self.worker.start_verify(request)
        return previous.result()

    def close(self):
        if self.in_flight is not None:
            self.in_flight.result()
        self.worker.close()


def make_client(name: str, address: str):
    from bass.coordinator import remote
    if name == "unary":
        return remote.RemoteTargetWorker(address, transport="unary")
    if name == "unary-spin":
        return UnarySpin(address)
    if name == "session":
        return remote.RemoteTargetWorker(address, transport="session")
    if name == "session-ahead":
        return SessionAhead(address)
    raise ValueError(name)


def measure(client, worker: WorkerProcess, calls: int, warmup: int = 20) -> dict:
    request = verify_request()
    for _ in range(warmup):
        client.verify(request)
    overheads = []
    cpu0, wcpu0, wall0 = time.process_time(), worker.cpu_s(), time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        response = client.verify(request)
        overheads.append(time.perf_counter() - t0 - response.compute_s)
    wall = time.perf_counter() - wall0
    cpu, wcpu = time.process_time() - cpu0, worker.cpu_s() - wcpu0
    overheads.sort()
    ms = [1000 * o for o in overheads]
    return {"overhead_ms_median": round(statistics.median(ms), 4), "overhead_ms_mean": round(statistics.fmean(ms), 4),
            "overhead_ms_p10": round(ms[len(ms) // 10], 4), "overhead_ms_p90": round(ms[9 * len(ms) // 10], 4),
            "client_cpu_ms_per_call": round(1000 * cpu / calls, 4),
            "worker_cpu_ms_per_call": round(1000 * wcpu / calls, 4),
            "wall_ms_per_call": round(1000 * wall / calls, 4)}


def environment() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    import grpc

    from bass.app.bench.environment import git_commit

    # commit: the script's checkout; bass_build: the bass package it imported, which on the GPU
    # machine is an installed wheel of its own build (its BUILD_COMMIT), maybe another commit.
    return {"device": "cpu", "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "grpcio": grpc.__version__, "commit": commit, "dirty": dirty,
            "bass_build": git_commit(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "serve"])
    parser.add_argument("--t-ms", default="1,3,10", help="worker step times (ms), comma-separated")
    parser.add_argument("--work", default="sleep,busy", help="sleep, busy or both")
    parser.add_argument("--clients", default="unary,unary-spin,session")
    parser.add_argument("--sockets", default="tcp,unix")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--address", default="127.0.0.1:0")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(float(args.t_ms), args.work, args.address)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for work in args.work.split(","):
            for t_ms in map(float, args.t_ms.split(",")):
                for socket in args.sockets.split(","):
                    address = "127.0.0.1:0" if socket == "tcp" else f"unix:{tmp}/worker-{work}-{t_ms}.sock"
                    worker = WorkerProcess(t_ms, work, address)
                    try:
                        for name in args.clients.split(","):
                            client = make_client(name, worker.address)
                            try:
                                calls = max(50, min(args.calls, int(args.calls * 3 / t_ms)))
                                row = {"work": work, "t_ms": t_ms, "socket": socket, "client": name, "calls": calls,
                                       **measure(client, worker, calls)}
                                # What a step costs beyond the worker's time, calls overlapped or not.
                                row["period_overhead_ms"] = round(row["wall_ms_per_call"] - t_ms, 4)
                            finally:
                                client.close()
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                    finally:
                        worker.stop()
    if args.out:
        args.out.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
