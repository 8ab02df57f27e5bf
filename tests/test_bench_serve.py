"""`bass bench serve`: its statistics on known inputs, its arrivals, its correctness checks
(against a fake server that goes wrong only under load, and real services fed a deliberately
unseeded request), and short real runs through the tiny models."""

from __future__ import annotations

import json
import math
import random
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from scipy import stats as scipy_stats

from bass.app.bench import serve_load
from bass.app.bench.serve import Load, ServeBenchConfig, run
from bass.app.bench.serve_check import Answer, answer_problems, check_run, stream_problems
from bass.app.bench.serve_records import DeltaEvent, RequestRecord
from bass.app.bench.serve_stats import Slo, itl_by_prefill, meets_slo, percentile, request_latency, summarize
from bass.app.bench.serve_workload import Prompt, RequestSpec, load_prompts, poisson_offsets, request_specs
from bass.v1 import generation_pb2 as pb
from bass.v1 import generation_pb2_grpc
from services import start_services

PROMPTS = [Prompt(f"p{i}", text) for i, text in enumerate(
    ["def fibonacci(n):\n", "for i in range(10):\n", "class Stack:\n    def push(self, x):\n", "import math\n"])]


def spec(n=1, temperature=0.0, seed=None, max_new_tokens=8, prompt=PROMPTS[0]) -> RequestSpec:
    return RequestSpec(prompt, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)


def record(deltas, *, s=None, sent_s=0.0, latency_s=1.0, status="OK", stats_tokens="sum") -> RequestRecord:
    events = [DeltaEvent(t, i, tuple(tokens), text, reason) for t, i, tokens, text, reason in deltas]
    return RequestRecord(spec=s or spec(n=len({d.index for d in events}) or 1), scheduled_s=sent_s, sent_s=sent_s,
                         deltas=events, status=status, latency_s=latency_s,
                         stats_generated_tokens=sum(len(d.token_ids) for d in events) if stats_tokens == "sum"
                         else stats_tokens)


# -- statistics ------------------------------------------------------------------------------------
def test_percentile_interpolates_between_ranks():
    xs = list(range(1, 11))
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 10
    assert percentile([7.0], 99) == 7.0
    data = [random.Random(3).gauss(0, 1) for _ in range(101)]
    for q in (1, 37, 50, 90, 99):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_request_latency_ttft_tpot_itl():
    # two sequences: seq 0 gets 1 + 3 + 2 tokens at 0.1, 0.3, 0.6 s; seq 1 gets 1 + 1 at 0.2, 0.5 s
    r = record([(0.1, 0, [1], "a", None), (0.2, 1, [4], "b", None), (0.3, 0, [2, 3, 4], "cde", None),
                (0.5, 1, [5], "f", "length"), (0.6, 0, [5, 6], "gh", "stop")], latency_s=0.65, s=spec(n=2))
    x = request_latency(r)
    assert x.ttft_s == pytest.approx(0.1)
    # seq 0: (0.6 - 0.1) / 5 = 0.1; seq 1: (0.5 - 0.2) / 1 = 0.3; mean 0.2
    assert x.tpot_s == pytest.approx(0.2)
    assert sorted(x.itl_s) == pytest.approx([0.2, 0.3, 0.3])
    assert x.output_tokens == 8 and x.deltas == 5 and x.e2e_s == 0.65


def test_goodput_counts_requests_meeting_every_slo_and_errors_by_code():
    fast = record([(0.05, 0, [1], "a", None), (0.07, 0, [2], "b", "length")], sent_s=0.0, latency_s=0.08)
    slow_ttft = record([(0.9, 0, [1], "a", None), (0.92, 0, [2], "b", "length")], sent_s=0.5, latency_s=0.95)
    slow_tpot = record([(0.05, 0, [1], "a", None), (0.55, 0, [2], "b", "length")], sent_s=1.0, latency_s=0.6)
    one_token = record([(0.05, 0, [1], "a", "length")], sent_s=1.5, latency_s=0.06)  # no TPOT: TTFT alone
    rejected = record([], sent_s=1.55, latency_s=0.001, status="RESOURCE_EXHAUSTED")
    slo = Slo(ttft_ms=100, tpot_ms=100)
    assert [meets_slo(request_latency(r), slo) for r in (fast, slow_ttft, slow_tpot, one_token)] == \
        [True, False, False, True]
    s = summarize([fast, slow_ttft, slow_tpot, one_token, rejected], slo)
    assert s["requests"] == 5 and s["completed"] == 4 and s["errors"] == {"RESOURCE_EXHAUSTED": 1}
    assert s["wall_s"] == pytest.approx(1.6)  # first send 0.0 to last end 1.0 + 0.6
    assert s["good_requests"] == 2 and s["goodput_per_s"] == pytest.approx(2 / 1.6, abs=1e-3)
    assert s["requests_per_s"] == pytest.approx(4 / 1.6, abs=1e-3)
    assert s["output_tokens"] == 7 and s["output_tokens_per_s"] == pytest.approx(7 / 1.6, abs=0.1)
    assert s["ttft_ms"]["count"] == 4 and s["ttft_ms"]["max"] == pytest.approx(900)
    assert summarize([fast], Slo())["goodput_per_s"] is None  # no SLO given: no goodput claimed


def test_itl_gaps_are_split_by_whether_another_request_started_in_them():
    running = record([(0.0, 0, [1], "", None), (0.1, 0, [2], "", None), (0.3, 0, [3], "", None),
                      (0.4, 0, [4], "", "length")], sent_s=0.0, latency_s=0.4)
    arrival = record([(0.05, 0, [9], "", None), (0.06, 0, [8], "", "length")], sent_s=0.2, latency_s=0.07)
    with_prefill, without = itl_by_prefill([running, arrival])
    # the arrival's first token came at 0.25, inside running's gap 0.1 -> 0.3
    assert with_prefill == [pytest.approx(0.2)]
    assert sorted(without) == pytest.approx([0.01, 0.1, 0.1])


# -- arrivals and requests ---------------------------------------------------------------------------
def test_poisson_arrivals_are_seeded_and_exponential():
    a = poisson_offsets(50.0, random.Random(1), count=4000)
    assert a == poisson_offsets(50.0, random.Random(1), count=4000)
    assert a != poisson_offsets(50.0, random.Random(2), count=4000)
    gaps = np.diff([0.0] + a)
    assert len(a) == 4000 and all(g > 0 for g in gaps)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1 / 50)).pvalue > 1e-3
    timed = poisson_offsets(50.0, random.Random(1), duration_s=2.0)
    assert timed == a[:len(timed)] and timed[-1] <= 2.0 < a[len(timed)]
    assert poisson_offsets(math.inf, random.Random(1), count=3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        poisson_offsets(math.inf, random.Random(1), duration_s=1.0)


def test_request_specs_cycle_prompts_with_one_seed_per_prompt():
    specs = request_specs(PROMPTS, 10, n=2, max_new_tokens=8, temperature=0.8, top_p=0.95, seed=5, seeded=True)
    assert specs == request_specs(PROMPTS, 10, n=2, max_new_tokens=8, temperature=0.8, top_p=0.95, seed=5,
                                  seeded=True)
    assert [s.prompt for s in specs[:4]] == [s.prompt for s in specs[4:8]]
    assert sorted(p.id for p in (s.prompt for s in specs[:4])) == ["p0", "p1", "p2", "p3"]
    seeds = {s.prompt.id: s.seed for s in specs}
    assert len(set(seeds.values())) == 4 and all(s.seed == seeds[s.prompt.id] for s in specs)
    assert all(s.deterministic for s in specs)
    unseeded = request_specs(PROMPTS, 4, n=1, max_new_tokens=8, temperature=0.8, top_p=1.0, seed=5, seeded=False)
    assert all(s.seed is None and not s.deterministic for s in unseeded)
    greedy = request_specs(PROMPTS, 4, n=1, max_new_tokens=8, temperature=0.0, top_p=1.0, seed=5, seeded=True)
    assert all(s.seed is None and s.deterministic for s in greedy)


def test_prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def a():", "id": "x"}\n\n{"prompt": "def b():"}\n')
    assert load_prompts(f) == [Prompt("x", "def a():"), Prompt("line3", "def b():")]
    f.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1"):
        load_prompts(f)
    assert len(load_prompts(None, "0:3")) == 3


# -- correctness checks on constructed streams ---------------------------------------------------------
def test_stream_problems_find_lost_duplicated_foreign_and_miscounted_sequences():
    good = [(0.1, 0, [1, 2], "ab", None), (0.1, 1, [3], "c", None), (0.2, 0, [4], "d", "stop"),
            (0.2, 1, [5], "e", "length")]
    assert stream_problems(record(good, s=spec(n=2))) == []
    lost = stream_problems(record(good[:3], s=spec(n=2)))
    assert lost == ["sequences [1] never finished"]
    twice = stream_problems(record(good + [(0.3, 1, [], "", "length")], s=spec(n=2)))
    assert any("finished more than once" in p for p in twice) and any("after finishing" in p for p in twice)
    foreign = stream_problems(record(good + [(0.3, 2, [7], "x", "stop")], s=spec(n=2)))
    assert any("unknown sequence indices [2]" in p for p in foreign)
    miscounted = stream_problems(record(good, s=spec(n=2), stats_tokens=6))
    assert miscounted == ["5 tokens streamed, final stats say 6"]
    assert stream_problems(record(good, s=spec(n=2), stats_tokens=None)) == ["no final stats message"]


def test_answer_problems_compare_tokens_then_text():
    ref = Answer((((1, 2, 3), "abc"),))
    same = record([(0.1, 0, [1, 2], "ab", None), (0.2, 0, [3], "c", "stop")])
    assert answer_problems(same, ref) == ([], [])
    other_token = record([(0.1, 0, [1, 9], "ab", None), (0.2, 0, [3], "c", "stop")])
    assert answer_problems(other_token, ref)[0] == ["sequence 0: tokens differ from the reference at position 1 "
                                                    "(3 vs 3 tokens)"]
    other_text = record([(0.1, 0, [1, 2], "ab", None), (0.2, 0, [3], "X", "stop")])
    assert answer_problems(other_text, ref) == ([], ["sequence 0: streamed text does not add up to the reference text"])


def test_check_run_counts_by_kind_and_never_passes_what_it_cannot_check():
    greedy, seeded, unseeded = spec(), spec(temperature=0.8, seed=3), spec(temperature=0.8)
    stream = [(0.1, 0, [1, 2], "ab", "stop")]
    wrong = [(0.1, 0, [1, 7], "ab", "stop")]
    refs = {greedy: Answer((((1, 2), "ab"),)), seeded: Answer((((1, 2), "ab"),))}
    records = [record(stream, s=greedy), record(wrong, s=greedy), record(wrong, s=seeded),
               record(stream, s=unseeded), record([], s=greedy, status="RESOURCE_EXHAUSTED")]
    out = check_run(records, refs)
    assert out["greedy_checked"] == 2 and out["greedy_mismatches"] == 1
    assert out["seeded_checked"] == 1 and out["seeded_mismatches"] == 1
    assert out["unchecked_unseeded"] == 1 and out["broken_streams"] == 0 and out["mismatches"] == 2
    assert len(out["examples"]) == 2
    assert check_run([record(stream, s=greedy)], {})["unchecked_no_reference"] == 1


# -- a fake server that answers right alone and wrong under load -----------------------------------------
class FlakyUnderLoad(generation_pb2_grpc.GenerationServicer):
    """Deterministic answers (a function of the prompt); under load it corrupts them as `fault`
    says, and beyond `capacity` streams it refuses like a full queue. A stream is under load when
    another stream arrived up to LOAD_WINDOW_S before it, or is in flight or arrives within
    LOAD_WINDOW_S after it: every stream of a burst, however slowly a busy machine sends them
    (with only "another in flight 50 ms after arrival", the first or last of a burst of 6 sent
    over more than 50 ms on a loaded 2-core CI machine read as alone)."""

    LOAD_WINDOW_S = 0.5

    def __init__(self, fault: str | None, capacity: int = 1000):
        self.fault, self.capacity = fault, capacity
        self.in_flight, self.lock = 0, threading.Condition()
        self.arrivals: list[float] = []

    @staticmethod
    def answer(request) -> list[list[int]]:
        base = sum(map(ord, request.prompt))
        return [[(base * 7 + i * 13 + j * 3) % 97 for j in range(request.max_new_tokens)] for i in range(request.n)]

    def Generate(self, request, context):
        return pb.GenerateResponse(sequences=[pb.Sequence(index=i, token_ids=t, text="".join(f"<{x}>" for x in t),
                                                          finish_reason=pb.FINISH_REASON_LENGTH)
                                              for i, t in enumerate(self.answer(request))])

    def GenerateStream(self, request, context):
        arrived = time.monotonic()
        with self.lock:
            if self.in_flight >= self.capacity:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue is full")
            self.in_flight += 1
            loaded = any(arrived - t < self.LOAD_WINDOW_S for t in self.arrivals)
            self.arrivals.append(arrived)
            self.lock.notify_all()
        try:
            time.sleep(0.05)  # let the other arrivals come in
            with self.lock:
                # Alone so far: wait for another arrival, up to the window.
                loaded = self.lock.wait_for(lambda: loaded or self.in_flight > 1 or self.arrivals[-1] != arrived,
                                            timeout=self.LOAD_WINDOW_S)
            fault = self.fault if loaded else None
            seqs = self.answer(request)
            if fault == "token":
                seqs[0][-1] = (seqs[0][-1] + 1) % 97
            total = 0
            for start in range(0, request.max_new_tokens, 2):
                for i, tokens in enumerate(seqs):
                    if fault == "lost" and i == len(seqs) - 1:
                        continue
                    chunk = tokens[start:start + 2]
                    total += len(chunk)
                    last = start + 2 >= request.max_new_tokens
                    text = "".join(f"<{x}>" for x in chunk)
                    yield pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(
                        index=i, token_ids=chunk, text=text.replace("<", "(") if fault == "text" else text,
                        finish_reason=pb.FINISH_REASON_LENGTH if last else pb.FINISH_REASON_UNSPECIFIED)])
                    if fault == "duplicate" and last and i == 0:
                        yield pb.GenerateStreamResponse(deltas=[pb.SequenceDelta(
                            index=0, finish_reason=pb.FINISH_REASON_LENGTH)])
                time.sleep(0.002)
            yield pb.GenerateStreamResponse(stats=pb.Stats(generated_tokens=total))
        finally:
            with self.lock:
                self.in_flight -= 1


def serve_fake(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("fault, kind", [(None, None), ("token", "greedy_mismatches"), ("text", "text_mismatches"),
                                         ("lost", "broken_streams"), ("duplicate", "broken_streams")])
def test_checks_catch_answers_that_go_wrong_only_under_load(fault, kind):
    server, address = serve_fake(FlakyUnderLoad(fault))
    try:
        config = ServeBenchConfig(loads=(Load("rate", math.inf), Load("rate", 2.0)), num_requests=6, n=2,
                                  max_new_tokens=6)
        result = run(address, config, PROMPTS, show_progress=False)
    finally:
        server.stop(0)
    assert result["references"] == {"requests": 4, "failed": {}, "wall_s": result["references"]["wall_s"]}
    burst, spaced = result["runs"]
    assert burst["completed"] == 6 and burst["errors"] == {}
    assert burst["correctness"]["greedy_checked"] == 6
    if fault is None:
        assert burst["correctness"]["mismatches"] == 0
    else:
        assert burst["correctness"][kind] == 6 and burst["correctness"]["mismatches"] == 6  # each request once
        assert burst["correctness"]["examples"]
    assert spaced["completed"] == 6 and spaced["correctness"]["greedy_checked"] == 6


def test_refusals_beyond_capacity_are_counted_by_status_code():
    server, address = serve_fake(FlakyUnderLoad(None, capacity=2))
    try:
        result = run(address, ServeBenchConfig(loads=(Load("rate", math.inf),), num_requests=8, max_new_tokens=4),
                     PROMPTS, show_progress=False)
    finally:
        server.stop(0)
    (r,) = result["runs"]
    assert r["completed"] == 2 and r["errors"] == {"RESOURCE_EXHAUSTED": 6}
    assert r["correctness"]["greedy_checked"] == 2 and r["correctness"]["mismatches"] == 0


# -- real services, tiny models -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def services(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft, policy="4", num_slots=16, max_batch_size=16, max_seq_len=512)
    yield s
    s.stop()


def test_real_run_greedy_with_regular_comparison(services):
    config = ServeBenchConfig(loads=(Load("rate", 40.0), Load("rate", math.inf)), num_requests=8, max_new_tokens=16,
                              n=2, compare_regular=True, slo=Slo(ttft_ms=60_000, tpot_ms=60_000))
    result = run(services.address, config, PROMPTS, show_progress=False)
    assert result["references"]["requests"] == 8 and result["references"]["failed"] == {}  # 4 prompts x 2 modes
    assert [(r["mode"], r["load"]["label"]) for r in result["runs"]] == \
        [("speculative", "40"), ("regular", "40"), ("speculative", "inf"), ("regular", "inf")]
    for r in result["runs"]:
        assert r["completed"] == 8 and r["errors"] == {}
        c = r["correctness"]
        assert c["greedy_checked"] == 8 and c["mismatches"] == 0, c["examples"]
        assert r["good_requests"] == 8
        assert 0 < r["ttft_ms"]["p50"] <= r["e2e_ms"]["p50"] and r["tpot_ms"]["count"] == 8
        assert r["output_tokens"] > 0 and r["itl_ms"]["count"] > 0
    spec_inf, regular_inf = result["runs"][2:]
    assert spec_inf["tokens_per_delta"] > 1.0 == regular_inf["tokens_per_delta"]  # speculation commits several


def test_real_run_seeded_repeats_and_an_unseeded_request_is_caught(services, monkeypatch):
    sampled = dict(loads=(Load("rate", math.inf),), num_requests=6, max_new_tokens=12, n=2, temperature=1.0)
    result = run(services.address, ServeBenchConfig(**sampled), PROMPTS, show_progress=False)
    (r,) = result["runs"]
    assert r["correctness"]["seeded_checked"] == 6 and r["correctness"]["mismatches"] == 0, r["correctness"]
    # The same run, but the load phase drops the seed on the wire (references keep it): the check must see it.
    real = serve_load.to_request

    def without_seed(s):
        request = real(s)
        request.ClearField("seed")
        return request

    monkeypatch.setattr(serve_load, "to_request", without_seed)
    result = run(services.address, ServeBenchConfig(**sampled), PROMPTS, show_progress=False)
    (r,) = result["runs"]
    assert r["correctness"]["seeded_checked"] == 6 and r["correctness"]["seeded_mismatches"] >= 5
    assert r["correctness"]["broken_streams"] == 0


def test_real_run_closed_loop(services):
    config = ServeBenchConfig(loads=(Load("concurrency", 1), Load("concurrency", 3)), num_requests=5,
                              max_new_tokens=8)
    result = run(services.address, config, PROMPTS, show_progress=False)
    for r in result["runs"]:
        assert r["completed"] == 5 and r["correctness"]["greedy_checked"] == 5 and r["correctness"]["mismatches"] == 0
    # one client at a time: no request waits for another's tokens, so no gap overlaps another's prefill
    assert result["runs"][0]["itl_ms_with_prefill"] is None


def test_real_run_through_the_openai_front_checks_text_and_counts_tokens(services, llama_target):
    """--openai: the same arrivals through BASS's OpenAI-compatible front: references by text,
    tokens per chunk from continuous usage (a speculative chunk carries several)."""
    from bass.app.http.server import serve_http
    from bass.core.config import HttpConfig

    http = serve_http(HttpConfig(port=0, coordinator_address=services.address, tokenizer_dir=llama_target))
    try:
        config = ServeBenchConfig(loads=(Load("rate", math.inf), Load("rate", 40.0)), num_requests=6,
                                  max_new_tokens=16, n=2, temperature=0.8, compare_regular=True)
        result = run(http.url, config, PROMPTS, show_progress=False, protocol="openai")
        closed = run(http.url, ServeBenchConfig(loads=(Load("concurrency", 2),), num_requests=4, max_new_tokens=8),
                     PROMPTS, show_progress=False, protocol="openai")
    finally:
        http.stop(grace_s=0)
    assert result["references"]["requests"] == 8 and result["references"]["failed"] == {}
    for r in result["runs"] + closed["runs"]:
        assert r["completed"] == r["requests"] and r["errors"] == {}
        c = r["correctness"]
        assert c["seeded_checked"] + c["greedy_checked"] == r["requests"] and c["mismatches"] == 0, c["examples"]
        assert r["ttft_ms"]["p50"] > 0 and r["output_tokens"] > 0
    speculative, regular = result["runs"][:2]
    assert speculative["output_tokens"] == regular["output_tokens"]  # the same seeded answers
    assert speculative["tokens_per_delta"] > 1.0 == regular["tokens_per_delta"]  # speculation commits several


def test_a_wrong_openai_url_fails_at_once():
    from bass.app.bench.serve_openai import served_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="no OpenAI-compatible server"):
        served_model(f"http://127.0.0.1:{port}/v1", timeout_s=5)


def test_cli_serve_writes_json_table_and_plot(llama_target, llama_draft, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bass.cli", "bench", "serve", "--serve", "--target", str(llama_target), "--draft",
         str(llama_draft), "--device", "cpu", "--num-slots", "8", "--max-seq-len", "1024", "--draft-length", "4",
         "--max-prefill-tokens-per-step", "300",
         "--rates", "20,inf", "--num-requests", "4", "--problems", "0:2", "--max-new-tokens", "8",
         "--compare-regular", "--slo-ttft-ms", "60000", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "serve.json").read_text())
    assert result["references"] == {"requests": 4, "failed": {}, "wall_s": result["references"]["wall_s"]}
    assert result["benchmark"] == "serve" and result["environment"]["device"] == "cpu"
    assert "bench serve" in result["environment"]["command"] and result["environment"]["commit"]
    # --max-new-tokens is the requests' length, not the server's limit (both flags share one command)
    assert result["config"]["max_new_tokens"] == 8
    assert result["server"]["coordinator"]["scheduler"]["max_new_tokens"] == 2048
    assert result["server"]["coordinator"]["scheduler"]["draft_length"]["fixed"] == 4
    assert result["server"]["coordinator"]["scheduler"]["max_prefill_tokens_per_step"] == 300
    assert [r["mode"] for r in result["runs"]] == ["speculative", "regular"] * 2
    assert all(r["completed"] == 4 and r["correctness"]["mismatches"] == 0 for r in result["runs"])
    assert (out / "serve.md").read_text().count("| speculative |") == 2 and "| speculative | inf |" in proc.stdout
    assert (out / "serve.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_model_flags_without_serve():
    proc = subprocess.run([sys.executable, "-m", "bass.cli", "bench", "serve", "--address", "127.0.0.1:1",
                           "--device", "cpu", "--rates", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--device need --serve" in proc.stderr


def test_a_wrong_address_fails_at_once():
    from bass.app.bench.serve import _require_server

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        _require_server(f"127.0.0.1:{port}", timeout_s=0.5)
    assert time.monotonic() - t0 < 5
