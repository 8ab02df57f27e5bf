"""What every serving process does around its gRPC server (bass/transport/grpc_server.py)."""


def test_freeze_startup_heap_takes_what_is_alive_out_of_the_collectors_reach():
    """A serving process freezes its start-up heap: a full collection then scans only what
    serving created (on a 2-core CPU ~100 ms for the imports of a worker, bench/cpu/gc_pause.py)."""
    import gc
    import time

    from bass.transport.grpc_server import freeze_startup_heap

    gc.unfreeze()  # an earlier test may have frozen this process (bass bench speed does)
    gc.collect()
    started = time.perf_counter()
    gc.collect()
    unfrozen_s = time.perf_counter() - started
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 10_000  # pytest, grpc, torch, ... are frozen
        started = time.perf_counter()
        gc.collect()
        assert time.perf_counter() - started < unfrozen_s / 2
    finally:
        gc.unfreeze()
