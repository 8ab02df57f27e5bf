"""What `bass router` adds to each streamed message, on any machine (issue #37).

A stand-in replica process serves bass.v1.Generation and bass.v1.Replica: each GenerateStream
sends MESSAGES messages, one every PERIOD ms (a decode step's pace), each stamped with the wall
time it left. The router (`bass router`, a process of its own) forwards them; this process
opens STREAMS streams at once, directly to the replica and then through the router, and
reports for each how long a message took from leaving the replica to arriving here (p50),
messages per second received, and the router process's CPU time per message (user + system,
from /proc): its capacity is about one core's worth of messages, 1 / that. The difference in
delivery is the router's cost per message while it keeps up with the rate; on a machine whose
cores the three processes share (the 2-core development box) it includes their contention.

    .venv/bin/python bench/cpu/router_overhead.py [--streams 1,16,64] [--period-ms 2] [--out FILE]
    .venv/bin/python bench/cpu/router_overhead.py replica --port P --period-ms 2 --messages 100  # the stand-in
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc


class StandIn(generation_pb2_grpc.GenerationServicer, generation_pb2_grpc.ReplicaServicer):
    def __init__(self, period_s: float, messages: int):
        self.period_s, self.messages = period_s, messages

    def Load(self, request, context):
        return pb.LoadResponse(serving=True, kv_slots=64, max_batch_size=64, max_waiting=256)

    def GenerateStream(self, request, context):
        start = time.perf_counter()
        for i in range(self.messages):
            while time.perf_counter() < start + i * self.period_s:
                time.sleep(0.0002)
            yield pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(index=0, token_ids=[i], text=repr(time.time()))])


def serve_replica(port: int, period_s: float, messages: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(128))
    servicer = StandIn(period_s, messages)
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    generation_pb2_grpc.add_ReplicaServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    signal.sigwait([signal.SIGTERM, signal.SIGINT])
    server.stop(0)


def measure(address: str, streams: int) -> dict:
    delays: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        with grpc.insecure_channel(address) as channel:
            for m in generation_pb2_grpc.GenerationStub(channel).GenerateStream(pb.GenerateRequest(prompt="p"),
                                                                                 timeout=120):
                d = (time.time() - float(m.deltas[0].text)) * 1e3
                with lock:
                    delays.append(d)
    threads = [threading.Thread(target=one) for _ in range(streams)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"delivery_p50_ms": statistics.median(delays), "messages_per_s": len(delays) / (time.perf_counter() - started)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(proc: subprocess.Popen, what: str) -> str:
    for line in proc.stdout:
        if what in line:
            return line
    raise RuntimeError(f"the process exited before printing {what!r}")


def main() -> None:
    if sys.argv[1:2] == ["replica"]:
        p = argparse.ArgumentParser()
        p.add_argument("replica")
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--period-ms", type=float, default=2.0)
        p.add_argument("--messages", type=int, default=100)
        a = p.parse_args()
        serve_replica(a.port, a.period_ms / 1000, a.messages)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--period-ms", type=float, default=2.0)
    p.add_argument("--messages", type=int, default=100)
    p.add_argument("--out")
    a = p.parse_args()
    replica_port, router_port = free_port(), free_port()
    replica = subprocess.Popen([sys.executable, __file__, "replica", "--port", str(replica_port), "--period-ms",
                                str(a.period_ms), "--messages", str(a.messages)], stdout=subprocess.PIPE, text=True)
    router = subprocess.Popen([sys.executable, "-m", "bass.cli", "router", "--replica", f"127.0.0.1:{replica_port}",
                               "--port", str(router_port)], stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        wait_line(replica, "ready")
        wait_line(router, '"service": "router"')
        for streams in map(int, a.streams.split(",")):
            direct = measure(f"127.0.0.1:{replica_port}", streams)
            cpu = cpu_seconds(router.pid)
            routed = measure(f"127.0.0.1:{router_port}", streams)
            cpu_us = (cpu_seconds(router.pid) - cpu) / (streams * a.messages) * 1e6
            rows.append({"streams": streams, "direct": direct, "router": routed, "router_cpu_us_per_message": cpu_us,
                         "added_p50_ms": routed["delivery_p50_ms"] - direct["delivery_p50_ms"]})
            print(f"{streams:3d} streams, a message every {a.period_ms:g} ms: delivery p50 "
                  f"{direct['delivery_p50_ms']:.3f} ms direct, {routed['delivery_p50_ms']:.3f} ms through the router "
                  f"(+{rows[-1]['added_p50_ms']:.3f}); {direct['messages_per_s']:.0f} / {routed['messages_per_s']:.0f} "
                  f"messages/s; router CPU {cpu_us:.0f} us a message")
    finally:
        for proc in (router, replica):
            proc.send_signal(signal.SIGINT)
            proc.wait(10)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "router_overhead", "machine": platform.node(), "cpus": os.cpu_count(),
                       "period_ms": a.period_ms, "messages": a.messages, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
