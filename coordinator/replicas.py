"""The replicas behind a router: where each is, whether it serves, how loaded it is.

Each replica is a coordinator with its own model workers (a whole `bass serve` stack on one
GPU). A thread per replica polls its `Replica/Load` every `poll_interval_s` on a long-lived
channel of its own; between polls the router adds what it forwarded since (and takes off what
came back), so a burst of requests spreads over the replicas instead of piling onto the one that
looked idle at the last poll. A replica is a candidate only while it serves: a poll that cannot
connect, or a forwarded call that failed with UNAVAILABLE, takes it out at once; polls that time
out take it out at the second in a row (a replica busy enough to answer late is not dead); the
next poll that finds it serving puts it back, whether it was restarted or never left.

A replica whose queue is full (a forwarded call answered RESOURCE_EXHAUSTED, or its last poll
showed `max_waiting` requests queued) stays a candidate but is chosen last: the router's next
requests go to replicas with room, and a full one is still asked when all are full (its queue
may have moved since). The mark from a call lasts until the next poll, which says how full it is.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import grpc

from bass.core.config import RouterConfig
from bass.v1 import generation_pb2 as pb

log = logging.getLogger(__name__)

GENERATE = "/bass.v1.Generation/Generate"
GENERATE_STREAM = "/bass.v1.Generation/GenerateStream"
LOAD = "/bass.v1.Replica/Load"

# gRPC's default reconnect backoff grows to two minutes: a replica that was down that long would
# rejoin up to two minutes after it came back. A second at most keeps "rejoins within about a
# second" true however long it was gone (the channel is never replaced: in-flight calls live on it).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
                   ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]


TIMEOUTS_TO_OUT = 2  # polls in a row that time out before a replica is out


class Replica:
    """One replica as the router sees it. `serving`, `load` and the in-flight counts change
    under `lock`. The router forwards on channels of its own (its event loop's); this one is
    for the polls."""

    def __init__(self, address: str, config: RouterConfig, on_change: Callable[["Replica"], None]):
        self.address = address
        self.config = config
        self._on_change = on_change
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._load = self.channel.unary_unary(LOAD, request_serializer=pb.LoadRequest.SerializeToString,
                                              response_deserializer=pb.LoadResponse.FromString)
        self._timeouts = 0  # polls in a row that timed out
        self.lock = threading.Lock()
        self.serving = False
        self.load: pb.LoadResponse | None = None
        self.in_flight = 0  # sequences forwarded and not yet answered
        self._in_flight_at_poll = 0  # ... when the last load arrived (the load counts those)
        self.down_since: float | None = time.monotonic()  # unknown until the first poll
        self.polled = threading.Event()  # set once the first poll has an answer, either way
        self.removed = False
        self._calls: set = set()  # how to cancel each upstream call in flight (if the replica is lost)
        self.lost = False  # no answer for lost_after_s: its calls were cancelled
        self._refused = False  # a call was answered RESOURCE_EXHAUSTED (its queue full) since the last poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll_loop, name=f"bass-replica-{address}", daemon=True)

    def start(self) -> "Replica":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.config.probe_timeout_s + 1)
        with self.lock:
            self.removed = True
        self.channel.close()

    # -- choosing ------------------------------------------------------------------------------------
    @property
    def full(self) -> bool:
        """Its queue is full: a call was refused RESOURCE_EXHAUSTED since the last poll, or
        that poll showed max_waiting requests queued (0: a replica that does not say)."""
        with self.lock:
            load = self.load
            return self._refused or (load is not None and 0 < load.max_waiting <= load.queued_requests)

    def score(self, n: int) -> float:
        """How full this replica would be with n more sequences: the sequences it runs and
        queues (its last load, plus what was forwarded since) over what it holds at once (its
        KV slots, or its batch limit if lower). Lower is better; above 1 the request queues."""
        with self.lock:
            load = self.load
            if load is None:
                return float("inf")
            pending = max(0, load.running_sequences + load.queued_sequences + self.in_flight - self._in_flight_at_poll)
        capacity = min(load.kv_slots or load.max_batch_size, load.max_batch_size) or 1
        return (pending + n) / capacity

    @property
    def max_n(self) -> int:
        """The most sequences a request may ask of it (its last poll; 0: not said)."""
        with self.lock:
            return self.load.max_n if self.load is not None else 0

    # -- forwarding ----------------------------------------------------------------------------------
    @contextmanager
    def forwarding(self, n: int) -> Iterator[Callable[[Callable[[], None]], None]]:
        """Count n sequences in flight while the block runs; the block registers how to cancel
        its upstream call (any thread may call it) with the function it is given, so that losing
        the replica cancels the call."""
        cancels: list = []
        with self.lock:
            self.in_flight += n

        def register(cancel: Callable[[], None]) -> None:
            with self.lock:
                self._calls.add(cancel)
                cancels.append(cancel)
        try:
            yield register
        finally:
            with self.lock:
                self.in_flight -= n
                self._calls.difference_update(cancels)

    def failed(self, reason: str) -> None:
        """A forwarded call found the replica unavailable: no new request until a poll finds it
        serving (the next poll, poll_interval_s away, if it does)."""
        self._set_serving(False, reason)

    def refused(self, reason: str) -> None:
        """A forwarded call was answered RESOURCE_EXHAUSTED (the replica's queue is full): it is
        chosen after every replica with room until the next poll."""
        with self.lock:
            already, self._refused = self._refused, True
        if not already:
            log.info("replica %s is full until its next poll: %s", self.address, reason)

    # -- polling -------------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.config.poll_interval_s)

    def poll(self) -> None:
        try:
            load = self._load(pb.LoadRequest(), timeout=self.config.probe_timeout_s)
        except grpc.RpcError as exc:
            self._timeouts = self._timeouts + 1 if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else 0
            if self._timeouts == 0 or self._timeouts >= TIMEOUTS_TO_OUT:
                self._set_serving(False, f"{exc.code().name}: {exc.details()}")
            self._maybe_lost()
        else:
            self._timeouts = 0
            with self.lock:
                self.load = load
                self._in_flight_at_poll = self.in_flight
                self.lost = False
                self._refused = False  # the load says how full it is now
            self._set_serving(load.serving, "its coordinator is not serving (target down or shutting down)")
        self.polled.set()

    def _set_serving(self, serving: bool, reason: str) -> None:
        with self.lock:
            changed = serving != self.serving
            self.serving = serving
            if serving:
                self.down_since = None
            elif self.down_since is None:
                self.down_since = time.monotonic()
        if changed:
            if serving:
                log.info("replica %s serves: it takes requests again", self.address)
            else:
                log.warning("replica %s is out: %s", self.address, reason)
        self._on_change(self)

    def _maybe_lost(self) -> None:
        """No answer for lost_after_s (a node lost: no connection reset ends its calls): cancel
        what is in flight there, which the router answers UNAVAILABLE, or retries elsewhere."""
        with self.lock:
            if self.lost or self.down_since is None or time.monotonic() - self.down_since < self.config.lost_after_s:
                return
            self.lost = True
            calls = list(self._calls)
        if calls:
            log.error("replica %s has not answered for %.1f s: cancelling its %d calls in flight", self.address,
                      self.config.lost_after_s, len(calls))
        for cancel in calls:
            cancel()


class ReplicaSet:
    """The replicas a router balances: a fixed list, or every address a DNS name resolves to
    (looked up again every discovery_interval_s: replicas that scale up or down join or leave)."""

    def __init__(self, config: RouterConfig, on_change: Callable[[Replica], None] = lambda r: None):
        self.config = config
        self._on_change = on_change
        self._lock = threading.Lock()
        self.replicas: dict[str, Replica] = {}
        self._rotation = itertools.count()
        self._stop = threading.Event()
        self._discovery: threading.Thread | None = None

    def start(self) -> "ReplicaSet":
        self.set_addresses(self.config.replicas + tuple(self.resolve() if self.config.replica_dns else ()))
        if self.config.replica_dns:
            self._discovery = threading.Thread(target=self._discover, name="bass-replica-dns", daemon=True)
            self._discovery.start()
        return self

    def wait_first_polls(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for replica in list(self.replicas.values()):
            replica.polled.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            replicas, self.replicas = list(self.replicas.values()), {}
        for replica in replicas:
            replica.stop()

    def set_addresses(self, addresses: Iterable[str]) -> None:
        wanted = list(dict.fromkeys(addresses))
        with self._lock:
            gone = [self.replicas.pop(a) for a in list(self.replicas) if a not in wanted]
            new = [Replica(a, self.config, self._on_change) for a in wanted if a not in self.replicas]
            self.replicas.update((r.address, r) for r in new)
        for replica in gone:
            log.info("replica %s left", replica.address)
            replica.stop()
            self._on_change(replica)
        for replica in new:
            log.info("replica %s joined", replica.address)
            replica.start()

    def resolve(self) -> list[str]:
        """Every address replica_dns resolves to, as host:port."""
        host, _, port = self.config.replica_dns.rpartition(":")
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        return sorted({f"[{i[4][0]}]:{port}" if i[0] == socket.AF_INET6 else f"{i[4][0]}:{port}" for i in infos})

    def _discover(self) -> None:
        while not self._stop.wait(self.config.discovery_interval_s):
            try:
                found = self.resolve()
            except OSError as exc:  # no replica ready (a headless Service without endpoints), or DNS down:
                log.warning("cannot resolve %s: %s; keeping the replicas known", self.config.replica_dns, exc)
                continue
            self.set_addresses(self.config.replicas + tuple(found))

    def serving(self) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas.values() if r.serving]

    def spread(self, n: int) -> list[Replica]:
        """The replicas to split a request of n sequences over: as many as have room for a part
        (not full, and the part fits in what each holds at once), at most n, the least loaded
        first (ties round the replicas in turn); [] where fewer than two have room, or where a
        replica would refuse the whole request for its n (max_n): a request is refused or not
        whatever the load."""
        serving = self.serving()
        if any(0 < r.max_n < n for r in serving):
            return []
        candidates = [r for r in serving if not r.full]
        if len(candidates) < 2 or n < 2:
            return []
        start = next(self._rotation) % len(candidates)
        candidates = sorted(candidates[start:] + candidates[:start], key=lambda r: r.score(0))
        for parts in range(min(n, len(candidates)), 1, -1):
            size = -(-n // parts)
            if all(r.score(size) <= 1 for r in candidates[:parts]):
                return candidates[:parts]
        return []

    def choose(self, n: int, exclude: Iterable[Replica] = ()) -> Replica | None:
        """The serving replica with the lowest score for a request of n sequences (ties go
        round the replicas in turn), a full one only if every candidate is full, or None if
        none serves."""
        skip = {id(r) for r in exclude}
        candidates = [r for r in self.serving() if id(r) not in skip]
        if not candidates:
            return None
        start = next(self._rotation) % len(candidates)
        return min(candidates[start:] + candidates[:start], key=lambda r: (r.full, r.score(n)))
