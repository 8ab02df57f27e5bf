"""`bass bench serve`: load against a running Generation service, the way its users run it.

For each offered load (Poisson rate, or closed-loop concurrency) the same seeded arrivals run
with speculation and, with `compare_regular`, again with `disable_speculation`; every request
streams. Before any load, each distinct deterministic request is sent alone for its reference
answer (serve_check), so that every run also reports what came back wrong under load.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

from bass.app.bench.serve_check import Answer, check_run, collect_references
from bass.app.bench.serve_load import run_closed_loop, run_open_loop
from bass.app.bench.serve_records import RequestRecord
from bass.app.bench.serve_stats import Slo, summarize
from bass.app.bench.serve_workload import Arrival, Prompt, RequestSpec, open_loop_schedule, request_specs


@dataclass(frozen=True)
class Load:
    kind: str  # "rate": open loop at value requests/s (inf: all at once); "concurrency": closed loop
    value: float

    @property
    def label(self) -> str:
        if self.kind == "rate":
            return "inf" if math.isinf(self.value) else f"{self.value:g}"
        return f"c{int(self.value)}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": "inf" if math.isinf(self.value) else self.value, "label": self.label}


@dataclass(frozen=True)
class ServeBenchConfig:
    loads: tuple[Load, ...]
    num_requests: int | None = None  # per run; with duration_s too, whichever ends first
    duration_s: float | None = None
    n: int = 1
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0  # arrivals, prompt order and the sampled requests' seeds
    seeded: bool = True  # sampled requests carry a seed (so their answers can be checked)
    compare_regular: bool = False
    check: bool = True
    slo: Slo = field(default_factory=Slo)
    timeout_s: float = 600.0  # per request

    def __post_init__(self) -> None:
        if not self.loads:
            raise ValueError("give at least one rate or concurrency")
        if len({load.kind for load in self.loads}) > 1:
            raise ValueError("give rates or concurrency, not both")
        for load in self.loads:
            if not load.value > 0 or (load.kind == "concurrency" and not float(load.value).is_integer()):
                raise ValueError(f"bad {load.kind} {load.value}: must be > 0 (concurrency: an integer)")
            if math.isinf(load.value) and (load.kind != "rate" or self.num_requests is None):
                raise ValueError("rate inf (all at once) needs --num-requests")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be >= 1")
        if not (self.temperature >= 0 and 0 < self.top_p <= 1):
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")

    @property
    def modes(self) -> tuple[str, ...]:
        return ("speculative", "regular") if self.compare_regular else ("speculative",)

    def spec_options(self) -> dict:
        return dict(n=self.n, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                    seeded=self.seeded)


def _progress(total: int | None, description: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="req", file=sys.stderr, disable=not enabled, leave=False,
                dynamic_ncols=True)


def _with_mode(spec: RequestSpec, mode: str) -> RequestSpec:
    return spec if mode == "speculative" else spec.regular()


@dataclass(frozen=True)
class Plan:
    """One load level's requests, shared by its speculative and regular runs."""

    load: Load
    arrivals: tuple[Arrival, ...] = ()  # open loop
    specs: tuple[RequestSpec, ...] = ()  # closed loop: the order requests are taken in (cycled)

    def distinct_specs(self) -> set[RequestSpec]:
        return {a.spec for a in self.arrivals} | set(self.specs)

    def closed_loop_specs(self, mode: str, count: int | None) -> Iterator[RequestSpec]:
        specs = (_with_mode(s, mode) for s in itertools.cycle(self.specs))
        return itertools.islice(specs, count) if count is not None else specs


def plan(config: ServeBenchConfig, prompts: list[Prompt]) -> list[Plan]:
    plans = []
    for load in config.loads:
        if load.kind == "rate":
            arrivals = open_loop_schedule(load.value, prompts, seed=config.seed, count=config.num_requests,
                                          duration_s=config.duration_s, **config.spec_options())
            plans.append(Plan(load, arrivals=tuple(arrivals)))
        else:
            # Cycling the first len(prompts) specs is the same sequence as request_specs(prompts, any count).
            count = min(config.num_requests or len(prompts), len(prompts))
            plans.append(Plan(load, specs=tuple(request_specs(prompts, count, seed=config.seed,
                                                              **config.spec_options()))))
    return plans


def _run_once(address: str, config: ServeBenchConfig, p: Plan, mode: str, show_progress: bool,
              protocol: str) -> list[RequestRecord]:
    total = len(p.arrivals) if p.load.kind == "rate" else config.num_requests
    with _progress(total, f"{mode} {p.load.kind} {p.load.label}", show_progress) as bar:
        on_done = lambda _record: bar.update(1)  # noqa: E731
        if p.load.kind == "rate":
            arrivals = [replace(a, spec=_with_mode(a.spec, mode)) for a in p.arrivals]
            return run_open_loop(address, arrivals, timeout_s=config.timeout_s, on_done=on_done, protocol=protocol)
        return run_closed_loop(address, p.closed_loop_specs(mode, config.num_requests), int(p.load.value),
                               duration_s=config.duration_s, timeout_s=config.timeout_s, on_done=on_done,
                               protocol=protocol)


def run(address: str, config: ServeBenchConfig, prompts: list[Prompt], *, show_progress: bool = True,
        log=lambda message: None, protocol: str = "grpc") -> dict:
    """All runs; returns {"config", "references", "runs": [...]} (the caller adds where it ran).
    protocol "openai": `address` is the base URL of an OpenAI-compatible server (serve_openai)."""
    if protocol == "openai":
        from bass.app.bench.serve_openai import collect_references as collect, served_model

        served_model(address)  # fails at once on a wrong URL
    else:
        _require_server(address)
        collect = collect_references
    plans = plan(config, prompts)
    references: dict = {}
    reference_wall = 0.0
    if config.check:
        wanted = {_with_mode(s, mode) for p in plans for s in p.distinct_specs() for mode in config.modes}
        deterministic = [s for s in sorted(wanted, key=_spec_order) if s.deterministic]
        t0 = time.perf_counter()
        with _progress(len(deterministic), "references (each request alone)", show_progress) as bar:
            references = collect(address, deterministic, timeout_s=config.timeout_s, on_done=lambda: bar.update(1))
        reference_wall = time.perf_counter() - t0
    runs = []
    for p in plans:
        for mode in config.modes:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            records = _run_once(address, config, p, mode, show_progress, protocol)
            # Near 1.0 the client itself (one Python process) limits what it measures.
            busy = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
            row = {"mode": mode, "load": p.load.to_dict(), **summarize(records, config.slo),
                   "client_cpu_busy": round(busy, 3)}
            row["correctness"] = check_run(records, references) if config.check else None
            log(f"{mode} {p.load.kind} {p.load.label}: {_one_line(row)}")
            runs.append(row)
    failed = {}
    for spec, answer in references.items():
        if not isinstance(answer, Answer):
            failed[answer.status] = failed.get(answer.status, 0) + 1
    return {"config": _config_dict(config),
            "references": {"requests": len(references), "failed": failed, "wall_s": round(reference_wall, 2)},
            "runs": runs}


def _require_server(address: str, timeout_s: float = 30.0) -> None:
    """Fail at once on a wrong address (rather than count every request as UNAVAILABLE)."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise ConnectionError(f"no service answers at {address} (waited {timeout_s:.0f} s)") from None


def _spec_order(s: RequestSpec):
    return (not s.speculate, s.prompt.id, s.seed or 0)


def _config_dict(config: ServeBenchConfig) -> dict:
    out = asdict(config)
    out["loads"] = [load.to_dict() for load in config.loads]
    return out


def _one_line(row: dict) -> str:
    def p50(key):
        return "-" if row[key] is None else f"{row[key]['p50']:.1f}"

    check = row["correctness"]
    return (f"{row['completed']}/{row['requests']} ok, errors {row['errors'] or 0}, "
            f"{row['output_tokens_per_s']} tok/s, TTFT p50 {p50('ttft_ms')} ms, TPOT p50 {p50('tpot_ms')} ms, "
            f"ITL p50 {p50('itl_ms')} ms, mismatches {'-' if check is None else check['mismatches']}")
