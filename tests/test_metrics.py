"""Prometheus metrics: what one coordinator counts, scraped over HTTP from the real services."""

from __future__ import annotations

import socket
import urllib.request
from dataclasses import replace

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bass.app.client import BassClient
from bass.coordinator import server as coordinator_server
from bass.coordinator.metrics import CoordinatorMetrics
from bass.coordinator.step_stats import StepStats
from bass.core.config import CoordinatorConfig
from bass.core.errors import InvalidRequestError
from services import start_services


def scrape(address: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from http://address/metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_step_counts_only_what_it_added():
    m = CoordinatorMetrics()
    before = StepStats(steps=3, draft_tokens=12, accepted_tokens=10, step_s=0.3, draft_s=0.1, verify_s=0.15,
                       lookup_tail_kept=2, chained_steps=2, sent_ahead_steps=1)
    after = StepStats(steps=4, draft_tokens=16, accepted_tokens=13, step_s=0.35, draft_s=0.12, verify_s=0.18,
                      lookup_tail_kept=5, chained_steps=3, sent_ahead_steps=2)
    m.step(before, after)
    m.step(after, after)  # a call that ran no step (nothing admitted) adds nothing
    # A call that committed nothing but dropped two steps sent ahead (a refusal) counts them.
    m.step(after, replace(after, dropped_ahead_steps=2))
    values = {(s.name, tuple(s.labels.items())): s.value for f in m.registry.collect() for s in f.samples}
    assert values[("bass_steps_total", ())] == 1
    assert values[("bass_draft_tokens_total", ())] == 4 and values[("bass_accepted_draft_tokens_total", ())] == 3
    assert values[("bass_step_duration_seconds_count", ())] == 1
    assert values[("bass_step_duration_seconds_sum", ())] == pytest.approx(0.05)
    assert values[("bass_step_duration_seconds_bucket", (("le", "0.064"),))] == 1
    assert values[("bass_step_duration_seconds_bucket", (("le", "0.032"),))] == 0
    assert values[("bass_draft_seconds_total", ())] == pytest.approx(0.02)
    assert values[("bass_lookup_tail_tokens_total", ())] == 3
    assert values[("bass_chained_steps_total", ())] == 1
    assert values[("bass_steps_sent_ahead_total", (("fate", "run"),))] == 1
    assert values[("bass_steps_sent_ahead_total", (("fate", "dropped"),))] == 2


def test_a_streamed_step_counts_the_streams_drafts_by_fate():
    """Streamed speculation: the drafts that arrived, kept or already contradicted, the
    sequence-steps that found none, the draft's busy time, and the lookup stand-ins accepted
    or rejected, as each step added them."""
    m = CoordinatorMetrics()
    before = StepStats(steps=2, stream_arrived=10, stream_kept=6, stream_starved=1, stream_draft_busy_s=0.01,
                       stream_looked_up=4, stream_lookup_kept=1)
    after = StepStats(steps=3, stream_arrived=15, stream_kept=8, stream_starved=3, stream_draft_busy_s=0.014,
                      stream_looked_up=11, stream_lookup_kept=3)
    m.step(before, after)
    values = {(s.name, tuple(s.labels.items())): s.value for f in m.registry.collect() for s in f.samples}
    assert values[("bass_stream_drafts_total", (("fate", "kept"),))] == 2
    assert values[("bass_stream_drafts_total", (("fate", "contradicted"),))] == 3
    assert values[("bass_stream_starved_sequence_steps_total", ())] == 2
    assert values[("bass_stream_draft_busy_seconds_total", ())] == pytest.approx(0.004)
    assert values[("bass_stream_lookup_tokens_total", (("fate", "accepted"),))] == 2
    assert values[("bass_stream_lookup_tokens_total", (("fate", "rejected"),))] == 5


def test_services_export_requests_tokens_and_acceptance(llama_target, llama_draft):
    services = start_services(llama_target, llama_draft, metrics_port=0)
    try:
        metrics = services.coordinator.metrics.address
        with BassClient(services.address, timeout_s=60) as client:
            client.generate([5, 17, 33, 200], n=2, max_new_tokens=16, ignore_eos=True)
            with pytest.raises(grpc.RpcError) as info:
                client.generate([5, 17], n=100, max_new_tokens=16)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        values = scrape(metrics)
    finally:
        services.stop()
    assert values[("bass_requests_total", (("outcome", "ok"),))] == 1
    assert values[("bass_requests_total", (("outcome", "rejected"),))] == 1
    assert values[("bass_sequences_total", (("finish_reason", "length"),))] == 2
    assert values[("bass_generated_tokens_total", ())] == 32
    steps = values[("bass_steps_total", ())]
    assert steps >= 1 and values[("bass_step_duration_seconds_count", ())] == steps
    drafted, accepted = values[("bass_draft_tokens_total", ())], values[("bass_accepted_draft_tokens_total", ())]
    assert drafted > 0 and 0 <= accepted <= drafted
    # each step commits accepted + 1 tokens per sequence: 32 tokens = accepted + sequence-steps
    assert accepted < 32
    assert values[("bass_request_duration_seconds_count", ())] == 1
    assert values[("bass_draft_available", ())] == 1 and values[("bass_target_available", ())] == 1
    assert values[("bass_running_sequences", ())] == 0
    assert 0 < values[("bass_verify_compute_seconds_total", ())] <= values[("bass_verify_seconds_total", ())]
    assert 0 <= values[("bass_verify_device_wait_seconds_total", ())] <= values[("bass_verify_compute_seconds_total", ())]


def test_a_taken_metrics_port_is_a_clear_error(llama_target):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = CoordinatorConfig(target_address="127.0.0.1:1", tokenizer_dir=llama_target, port=0,
                                   metrics_port=port)
        with pytest.raises(InvalidRequestError, match=f"metrics_port: cannot serve metrics on 127.0.0.1:{port}"):
            coordinator_server.serve(config)
