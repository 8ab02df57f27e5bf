"""What the load generator saw of one request: the raw stream, timestamped on arrival.

Kept raw (every delta as it came) so that the statistics (serve_stats) and the correctness
checks (serve_check) each read what they need from one record, and neither trusts the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bass.app.bench.serve_workload import RequestSpec

OK = "OK"


@dataclass(frozen=True)
class DeltaEvent:
    t_s: float  # when it reached the client, seconds after the request was sent
    index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None  # stop | length | time_budget, on a sequence's last delta


@dataclass
class RequestRecord:
    spec: RequestSpec
    scheduled_s: float  # planned send time, after the run's start
    sent_s: float  # actual send time, after the run's start
    deltas: list[DeltaEvent] = field(default_factory=list)
    status: str = OK  # a gRPC status code name
    detail: str = ""
    latency_s: float | None = None  # send to the end of the stream
    stats_generated_tokens: int | None = None  # what the final message's stats say

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def end_s(self) -> float:
        return self.sent_s + (self.latency_s or 0.0)

    def tokens_by_index(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for d in self.deltas:
            out.setdefault(d.index, []).extend(d.token_ids)
        return out

    def text_by_index(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for d in self.deltas:
            out[d.index] = out.get(d.index, "") + d.text
        return out

    def token_times_by_index(self) -> dict[int, list[tuple[float, int]]]:
        """(arrival time, tokens it carried) of each delta that carried tokens, per sequence."""
        out: dict[int, list[tuple[float, int]]] = {}
        for d in self.deltas:
            if d.token_ids:
                out.setdefault(d.index, []).append((d.t_s, len(d.token_ids)))
        return out
