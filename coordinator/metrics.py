"""Prometheus metrics of one coordinator: requests, tokens, acceptance, where step time goes.

The coordinator sees every request and every step, so it is the one place that counts them;
the workers' compute time reaches it with each response. Metrics live in a registry of their
own (no process-wide state), served over HTTP at /metrics when `metrics_port` is set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from threading import Thread

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from bass.coordinator.requests import GenerationResult
from bass.coordinator.step_stats import StepStats
from bass.core.errors import CapacityError, InvalidRequestError, RequestCancelled, WorkerUnavailableError

log = logging.getLogger(__name__)

STEP_BUCKETS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 4.0)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


def outcome_of(error: BaseException) -> str:
    """The `outcome` label of a request that ended in `error`."""
    if isinstance(error, (InvalidRequestError, CapacityError)):
        return "rejected"
    if isinstance(error, WorkerUnavailableError):
        return "unavailable"
    if isinstance(error, RequestCancelled):
        return "cancelled"
    return "error"


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("bass_requests", "Requests answered, by outcome: ok (a result, possibly "
                                "cut by its time budget), rejected, cancelled, unavailable, error",
                                ["outcome"], registry=r)
        self.sequences = Counter("bass_sequences", "Sequences returned, by finish reason", ["finish_reason"],
                                 registry=r)
        self.request_seconds = Histogram("bass_request_duration_seconds", "Submission to result",
                                         buckets=REQUEST_BUCKETS, registry=r)
        self.queue_seconds = Histogram("bass_request_queue_seconds", "Submission to admission into the batch",
                                       buckets=REQUEST_BUCKETS, registry=r)
        self.generated_tokens = Counter("bass_generated_tokens", "Tokens returned (counted when a request ends)",
                                        registry=r)
        self.steps = Counter("bass_steps", "Decode steps (one Propose and one Verify for the whole batch)",
                             registry=r)
        self.step_seconds = Histogram("bass_step_duration_seconds", "One step, as the coordinator sees it",
                                      buckets=STEP_BUCKETS, registry=r)
        self.draft_tokens = Counter("bass_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter("bass_accepted_draft_tokens", "Draft tokens the target accepted",
                                       registry=r)
        self.draft_seconds = Counter("bass_draft_seconds", "Time in Propose calls, transport included", registry=r)
        self.draft_compute_seconds = Counter("bass_draft_compute_seconds", "Time inside the draft worker",
                                             registry=r)
        self.verify_seconds = Counter("bass_verify_seconds", "Time in Verify calls, transport included", registry=r)
        self.verify_compute_seconds = Counter("bass_verify_compute_seconds", "Time inside the target worker",
                                              registry=r)
        self.verify_device_wait_seconds = Counter("bass_verify_device_wait_seconds", "Of the time inside the "
                                                  "target worker, waiting on its device (the rest is its host "
                                                  "work)", registry=r)
        # Streamed speculation (two GPUs): whether the draft keeps the target fed.
        self.stream_drafts = Counter("bass_stream_drafts", "Draft tokens that arrived from the draft stream, "
                                     "by fate: kept (they continued the committed text) or contradicted (the "
                                     "target had decided otherwise on their way)", ["fate"], registry=r)
        self.stream_starved = Counter("bass_stream_starved_sequence_steps", "Sequence-steps of streamed "
                                      "speculation that found no draft to verify", registry=r)
        self.stream_draft_busy_seconds = Counter("bass_stream_draft_busy_seconds", "Time the draft stream had a "
                                                 "proposal on its device", registry=r)
        self.stream_lookup_tokens = Counter("bass_stream_lookup_tokens", "Positions of streamed steps the draft "
                                            "left empty, filled from the sequence's own earlier text, by fate: "
                                            "accepted or rejected by the target", ["fate"], registry=r)
        self.lookup_tail_tokens = Counter("bass_lookup_tail_tokens", "Lookup tokens the target verified after "
                                          "a step's drafts and accepted ([target] lookup_tail)", registry=r)
        self.chained_steps = Counter("bass_chained_steps", "Speculative steps whose proposal ran behind the "
                                     "verification before them (the others drafted on the step's critical path)",
                                     registry=r)
        self.sent_ahead_steps = Counter("bass_steps_sent_ahead", "Speculative steps sent before the previous "
                                        "step's answer was read (a co-located pair), by fate: run, or dropped "
                                        "unrun (the worker had not queued the chained proposal they were to "
                                        "run on)", ["fate"], registry=r)
        self.running = Gauge("bass_running_sequences", "Sequences in the batch", registry=r)
        self.waiting = Gauge("bass_waiting_requests", "Requests queued for a place in the batch", registry=r)
        self.draft_available = Gauge("bass_draft_available", "1 while the draft worker serves, else 0 "
                                     "(regular decoding)", registry=r)
        self.target_available = Gauge("bass_target_available", "1 while the target worker serves, else 0",
                                       registry=r)

    def step(self, before: StepStats, after: StepStats) -> None:
        """Count what one step added to the scheduler's cumulative step statistics."""
        d = {f.name: getattr(after, f.name) - getattr(before, f.name) for f in fields(StepStats)
             if isinstance(getattr(after, f.name), (int, float))}  # the counters, not the dict/trace
        if d["dropped_ahead_steps"]:  # a step that committed nothing can drop steps sent ahead
            self.sent_ahead_steps.labels("dropped").inc(d["dropped_ahead_steps"])
        if not d["steps"]:
            return
        self.steps.inc(d["steps"])
        self.step_seconds.observe(d["step_s"])
        self.draft_tokens.inc(d["draft_tokens"])
        self.accepted_tokens.inc(d["accepted_tokens"])
        self.draft_seconds.inc(d["draft_s"])
        self.draft_compute_seconds.inc(d["draft_compute_s"])
        self.verify_seconds.inc(d["verify_s"])
        self.verify_compute_seconds.inc(d["verify_compute_s"])
        self.verify_device_wait_seconds.inc(d["verify_device_wait_s"])
        if d["stream_arrived"]:
            self.stream_drafts.labels("kept").inc(d["stream_kept"])
            self.stream_drafts.labels("contradicted").inc(d["stream_arrived"] - d["stream_kept"])
        self.stream_starved.inc(d["stream_starved"])
        self.stream_draft_busy_seconds.inc(d["stream_draft_busy_s"])
        self.lookup_tail_tokens.inc(d["lookup_tail_kept"])
        self.chained_steps.inc(d["chained_steps"])
        if d["sent_ahead_steps"]:
            self.sent_ahead_steps.labels("run").inc(d["sent_ahead_steps"])
        if d["stream_looked_up"]:
            self.stream_lookup_tokens.labels("accepted").inc(d["stream_lookup_kept"])
            self.stream_lookup_tokens.labels("rejected").inc(d["stream_looked_up"] - d["stream_lookup_kept"])

    def batch(self, running: int, waiting: int, draft_up: bool) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.draft_available.set(int(draft_up))

    def request_done(self, result: GenerationResult) -> None:
        self.requests.labels("ok").inc()
        stats = result.stats
        self.request_seconds.observe(stats.queue_time_s + stats.wall_time_s)
        self.queue_seconds.observe(stats.queue_time_s)
        self.generated_tokens.inc(stats.generated_tokens)
        for s in result.sequences:
            self.sequences.labels(s.finish_reason.value).inc()

    def request_failed(self, error: BaseException) -> None:
        self.requests.labels(outcome_of(error)).inc()


@dataclass
class MetricsServer:
    """/metrics over HTTP on its own thread."""

    host: str
    port: int
    _httpd: object
    _thread: Thread

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def serve_metrics(metrics, host: str, port: int) -> MetricsServer:
    """Serve `metrics` (CoordinatorMetrics, or anything else with a `registry`: the router's)
    at http://host:port/metrics (port 0: any free port)."""
    httpd, thread = start_http_server(port, addr=host, registry=metrics.registry)
    bound = httpd.server_address[1]
    log.info("metrics at http://%s:%d/metrics", host, bound)
    return MetricsServer(host, bound, httpd, thread)
