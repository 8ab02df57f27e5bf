"""How long one full garbage collection takes in a process that imported what a serving process
imports (torch, transformers, grpc, the services), with and without the start-up heap frozen
(bass.grpc_server.freeze_startup_heap). CPU only; prints milliseconds."""

import gc
import time

import grpc  # noqa: F401 - imported for its objects, as a service would
import torch  # noqa: F401
import transformers  # noqa: F401

import bass.cli  # noqa: F401
import bass.coordinator.scheduler  # noqa: F401
import bass.target_service.colocated  # noqa: F401
from bass.transport.grpc_server import freeze_startup_heap


def full_collection_ms() -> float:
    started = time.perf_counter()
    gc.collect()
    return 1000 * (time.perf_counter() - started)


gc.collect()
print(f"objects tracked: {len(gc.get_objects())}")
print(f"full collection, unfrozen: {full_collection_ms():.1f} ms")
freeze_startup_heap()
print(f"full collection, frozen ({gc.get_freeze_count()} objects): {full_collection_ms():.1f} ms")
