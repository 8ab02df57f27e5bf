"""Latency and throughput statistics of one load run, as vLLM's benchmark_serving defines them.

- TTFT: send to the first delta carrying a token (of any of the request's sequences).
- TPOT: per sequence (last token's arrival - first token's arrival) / (tokens - 1); a request's
  TPOT is the mean over its sequences with at least two tokens (n = 1: vLLM's definition).
- ITL: the gaps between consecutive deltas of one sequence, i.e. what a reader of the stream
  waits. With speculation one delta often carries several tokens, so ITL counts steps, not
  tokens; a stall (a step delayed by someone else's prefill) shows up in its tail.
- ITL split by arrivals: a gap during which another request received its first token (so was
  prefilled in that gap's step) counts as "with prefill", else "without"; the two tails side by
  side show whether arrivals stall running sequences.
- E2E: send to the end of the stream.
- Throughput: completed requests and output tokens over the run's wall time (first scheduled
  send to last answer). Goodput: requests/s that met every SLO given.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass

from bass.app.bench.serve_records import RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"slo {name} must be a positive number, got {value}")

    @property
    def given(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None


@dataclass(frozen=True)
class RequestLatency:
    ttft_s: float | None  # None: no token arrived
    tpot_s: float | None  # None: no sequence had two tokens
    itl_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int
    deltas: int


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_latency(record: RequestRecord) -> RequestLatency:
    per_seq = record.token_times_by_index()
    firsts = [times[0][0] for times in per_seq.values()]
    tpots, itls = [], []
    for times in per_seq.values():
        tokens = sum(count for _, count in times)
        if tokens > 1:
            tpots.append((times[-1][0] - times[0][0]) / (tokens - 1))
        itls += [b[0] - a[0] for a, b in zip(times, times[1:])]
    return RequestLatency(ttft_s=min(firsts) if firsts else None,
                          tpot_s=sum(tpots) / len(tpots) if tpots else None, itl_s=tuple(itls),
                          e2e_s=record.latency_s or 0.0,
                          output_tokens=sum(count for times in per_seq.values() for _, count in times),
                          deltas=sum(len(times) for times in per_seq.values()))


def meets_slo(latency: RequestLatency, slo: Slo) -> bool:
    """A request without a TPOT (one token per sequence) is judged on TTFT alone."""
    if slo.ttft_ms is not None and (latency.ttft_s is None or latency.ttft_s * 1e3 > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None and latency.tpot_s is not None and latency.tpot_s * 1e3 > slo.tpot_ms:
        return False
    return True


def distribution_ms(values_s: list[float]) -> dict | None:
    if not values_s:
        return None
    ms = [v * 1e3 for v in values_s]
    return {"mean": round(sum(ms) / len(ms), 3), **{f"p{q}": round(percentile(ms, q), 3) for q in PERCENTILES},
            "max": round(max(ms), 3), "count": len(ms)}


# Deltas of one step reach different streams a little apart; a first token this soon after a
# gap's end still came from that gap's step.
SAME_STEP_S = 0.001


def itl_by_prefill(records: list[RequestRecord]) -> tuple[list[float], list[float]]:
    """(gaps during which another request got its first token, the other gaps), in seconds."""
    firsts = []  # (absolute time of a request's first token, its position in records)
    for i, r in enumerate(records):
        t = min((d.t_s for d in r.deltas if d.token_ids), default=None)
        if r.ok and t is not None:
            firsts.append((r.sent_s + t, i))
    firsts.sort()
    times = [t for t, _ in firsts]
    with_prefill, without = [], []
    for i, r in enumerate(records):
        if not r.ok:
            continue
        for seq in r.token_times_by_index().values():
            for (a, _), (b, _) in zip(seq, seq[1:]):
                lo = bisect.bisect_right(times, r.sent_s + a)
                hi = bisect.bisect_right(times, r.sent_s + b + SAME_STEP_S)
                others = any(firsts[j][1] != i for j in range(lo, hi))
                (with_prefill if others else without).append(b - a)
    return with_prefill, without


def summarize(records: list[RequestRecord], slo: Slo) -> dict:
    """One run's figures. Only completed requests enter the latency figures; every other
    outcome is counted under its gRPC status code."""
    statuses = Counter(r.status for r in records)
    done = [r for r in records if r.ok]
    latencies = [request_latency(r) for r in done]
    wall = max((r.end_s for r in records), default=0.0) - min((r.scheduled_s for r in records), default=0.0)
    tokens = sum(x.output_tokens for x in latencies)
    good = sum(meets_slo(x, slo) for x in latencies) if slo.given else None
    last_send = max((r.sent_s for r in records), default=0.0)
    with_prefill, without_prefill = itl_by_prefill(records)
    return {
        "requests": len(records), "completed": len(done),
        "errors": {code: count for code, count in sorted(statuses.items()) if code != "OK"},
        "wall_s": round(wall, 3),
        "sent_per_s": round(len(records) / last_send, 3) if last_send > 0 else None,
        "requests_per_s": round(len(done) / wall, 3) if wall > 0 else None,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "tokens_per_delta": round(tokens / sum(x.deltas for x in latencies), 3) if latencies else None,
        "ttft_ms": distribution_ms([x.ttft_s for x in latencies if x.ttft_s is not None]),
        "tpot_ms": distribution_ms([x.tpot_s for x in latencies if x.tpot_s is not None]),
        "itl_ms": distribution_ms([g for x in latencies for g in x.itl_s]),
        "itl_ms_with_prefill": distribution_ms(with_prefill),
        "itl_ms_without_prefill": distribution_ms(without_prefill),
        "e2e_ms": distribution_ms([x.e2e_s for x in latencies]),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "good_requests": good,
        "goodput_per_s": round(good / wall, 3) if good is not None and wall > 0 else None,
        "send_lag_ms": distribution_ms([max(0.0, r.sent_s - r.scheduled_s) for r in records]),
    }
