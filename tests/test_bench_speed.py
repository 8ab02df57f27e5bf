"""`bass bench speed` on tiny models, in-process and through the real services."""

import json

import pytest
from click.testing import CliRunner

from bass.cli import main


@pytest.mark.parametrize("services", [False, True])
def test_speed_bench_accounts_for_every_token_and_millisecond(llama_target, tmp_path, services):
    out = tmp_path / "speed.json"
    args = ["bench", "speed", "--target", str(llama_target), "--draft", str(llama_target), "--problems", "0:2",
            "--batches", "2", "--policies", "0,3", "--max-new-tokens", "10", "--device", "cpu", "--out", str(out)]
    result = CliRunner().invoke(main, args + (["--services"] if services else []))
    assert result.exit_code == 0, result.output
    regular, spec = json.loads(out.read_text())["results"]
    for row in (regular, spec):
        assert row["generated_tokens"] == 2 * 10 and row["services"] == services
        assert len(row["wall_s_all_runs"]) == 3 and row["wall_s"] == sorted(row["wall_s_all_runs"])[1]  # the median
        assert sorted(row["wall_s_per_round"]) == row["wall_s_all_runs"]  # the same walls, in round order
        assert len(row["outputs_digest_per_round"]) == 3
        mean_ms = 1000 * sum(row["wall_s_all_runs"]) / 3 / 10
        assert abs(row["ms_per_token_per_sequence_mean"] - mean_ms) <= 0.06  # the mean round (walls kept to the ms)
        b = row["step_stats"]["breakdown_ms_per_step"]
        parts = b["draft_ms"] + b["verify_ms"] + b["rpc_ms"] + b["coordinator_ms"]
        assert abs(parts - b["step_ms"]) < 1e-6 * max(1, b["step_ms"]) + 1e-3
        assert min(b.values()) >= -1e-3
        slowest_ms = 1000 * row["step_stats"]["slowest_step_s"]
        assert b["step_ms"] - 1e-6 <= slowest_ms <= 1000 * row["wall_s"]  # the longest step: at least the mean
    assert regular["tokens_per_sequence_step"] == 1.0 and regular["step_stats"]["draft_tokens"] == 0
    assert regular["step_stats"]["steps_by_length"] == {"0": regular["steps"]}
    assert spec["step_stats"]["steps_by_length"] == {"3": spec["steps"]}
    # draft == target: every proposal accepted, so each step commits k + 1 = 4 tokens per sequence
    assert spec["acceptance_rate"] == 1.0 and spec["tokens_per_sequence_step"] > 3
    if services:
        assert spec["step_stats"]["breakdown_ms_per_step"]["rpc_ms"] > 0


def test_hf_baseline_generates_every_token(llama_target, tmp_path):
    out = tmp_path / "hf.json"
    result = CliRunner().invoke(main, ["bench", "hf", "--model", str(llama_target), "--problems", "0:3", "--batches",
                                       "3", "--max-new-tokens", "6", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["results"]
    assert row["generated_tokens"] == 3 * 6 and row["ms_per_token_per_sequence"] > 0


def test_speed_bench_runs_every_policy_on_the_same_seeded_texts(llama_target, llama_draft, tmp_path):
    """Sampled rows are seeded per round alike for every policy, so policies are compared on
    the same texts: regular and speculative decoding (lossless, fp32) agree round by round,
    and different rounds decode different texts."""
    out = tmp_path / "speed.json"
    result = CliRunner().invoke(main, [
        "bench", "speed", "--target", str(llama_target), "--draft", str(llama_draft), "--problems", "0:2",
        "--batches", "2", "--policies", "0,3,auto", "--max-new-tokens", "12", "--mode", "t0.8-p0.95",
        "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    digests = [row["outputs_digest_per_round"] for row in rows]
    assert digests[0] == digests[1] == digests[2]
    assert len(set(digests[0])) == 3
    assert rows[1]["step_stats"]["draft_tokens"] > 0
    state = rows[2]["policy_state"]  # auto's costs as it measured them, per batch-size bucket
    assert "policy_state" not in rows[1] and state["buckets"]["2"]["verify"] and 0 < state["acceptance"] < 1


def test_a_step_trace_records_every_step_when_asked(llama_target, llama_draft):
    """StepStats.trace (benchmarks opt in): one entry per step with its draft length, sequences,
    tokens (and each sequence's, by id) and commit time; none kept otherwise."""
    from bass.coordinator.requests import GenerationRequest
    from bass.coordinator.step_stats import StepStats
    from conftest import build_scheduler

    scheduler = build_scheduler(llama_target, llama_draft, "3")
    assert scheduler.step_stats.trace is None
    scheduler.step_stats = stats = StepStats(trace=[])
    scheduler.generate([GenerationRequest(prompt_ids=(5, 6, 7), max_new_tokens=12, n=2, ignore_eos=True)])
    assert len(stats.trace) == stats.steps > 1
    assert sum(tokens for _, _, tokens, _, _, _, _ in stats.trace) == stats.committed_tokens
    for _, seqs, tokens, _, _, per_sequence, _ in stats.trace:  # each sequence's own tokens
        assert len(per_sequence) == seqs and sum(n for _, n in per_sequence) == tokens
        assert all(n >= 1 for _, n in per_sequence)
    assert len({seq_id for seq_id, _ in stats.trace[0][5]}) == 2
    assert {k for k, *_ in stats.trace} == {int(k) for k in stats.steps_by_length}
    assert all(seqs == 2 for _, seqs, *_ in stats.trace[:-1])
    times = [at for *_, at in stats.trace]
    assert times == sorted(times)


def test_speed_bench_keeps_the_reported_rounds_step_trace_when_asked(llama_target, llama_draft, tmp_path):
    import gc

    threshold = gc.get_threshold()
    gc.set_threshold(50)  # collections in every run (restored below)
    out = tmp_path / "speed.json"
    try:
        result = CliRunner().invoke(main, [
            "bench", "speed", "--target", str(llama_target), "--draft", str(llama_draft), "--problems", "0:2",
            "--batches", "2", "--policies", "0,2", "--max-new-tokens", "8", "--device", "cpu", "--trace",
            "--out", str(out)])
    finally:
        gc.set_threshold(*threshold)
    assert result.exit_code == 0, result.output
    for row in json.loads(out.read_text())["results"]:
        stats = row["step_stats"]
        trace = stats["trace"]
        assert len(trace) == stats["steps"]
        assert sum(tokens for _, _, tokens, *_ in trace) == stats["committed_tokens"]
        assert all(sum(n for _, n in entry[5]) == entry[2] for entry in trace)  # [seq_id, tokens] pairs
        assert {str(k) for k, *_ in trace} == set(stats["steps_by_length"])
        at = [entry[-1] for entry in trace]
        assert at == sorted(at) and 0 < at[-1] <= 1000 * row["wall_s"] + 1  # wall_s is rounded to ms
        assert row["gc_pauses"], "a collection every 50 allocations: some ran"
        for generation, start, took in row["gc_pauses"]:  # the coordinator's collections in that run
            assert generation in (0, 1, 2) and 0 <= start and start + took <= 1000 * row["wall_s"] + 1


def test_speed_bench_runs_the_target_here_and_the_draft_in_a_process_of_its_own(llama_target, llama_draft, tmp_path):
    """--separate-draft without --services: the target in the bench's process, the draft a real
    service process (the streamed draft's own GPU, without the Verify round trip). Every policy,
    streamed included, writes the texts the all-in-process run writes (fp32: lossless). The
    streamed steps wait up to 200 ms for a first draft (w200): on the CPU a short run could
    otherwise end before any draft arrived."""
    texts = {}
    for placement in (["--separate-draft"], []):
        out = tmp_path / f"speed{len(placement)}.json"
        result = CliRunner().invoke(main, [
            "bench", "speed", "--target", str(llama_target), "--draft", str(llama_draft), "--problems", "0:2",
            "--batches", "2", "--policies", "0,3,stream3w200", "--max-new-tokens", "10", "--device", "cpu",
            "--repeats", "1", "--out", str(out), *placement])
        assert result.exit_code == 0, result.output
        rows = json.loads(out.read_text())["results"]
        assert {(r["services"], r["draft_process"]) for r in rows} == {(False, "own" if placement else "target's")}
        texts[bool(placement)] = [r["outputs_digest_per_round"] for r in rows]
        if placement:
            streamed = rows[2]["step_stats"]
            assert streamed["stream_arrived"] > 0, "the draft process streamed drafts to this one"
    assert texts[True] == texts[False]
    assert len({d[0] for d in texts[True]}) == 1  # regular, k = 3 and streamed: one greedy text


def test_auto_warms_up_on_a_whole_round_and_fixed_lengths_on_a_short_one(llama_target, llama_draft, tmp_path,
                                                                         monkeypatch):
    """`auto` learns per batch-size bucket, and only a whole round reaches the buckets of its
    tail, so its untimed warm-up round is as long as the timed ones; a fixed length learns
    nothing and warms up on 16 tokens."""
    from bass.app.bench import speed

    asked = []
    original = speed.case_requests

    def recording(prompts, batch, mode, tokens, round_):
        asked.append((round_, tokens))
        return original(prompts, batch, mode, tokens, round_)

    monkeypatch.setattr(speed, "case_requests", recording)
    args = ["bench", "speed", "--target", str(llama_target), "--draft", str(llama_draft), "--problems", "0:2",
            "--batches", "2", "--policies", "3,auto", "--max-new-tokens", "24", "--device", "cpu", "--repeats", "2",
            "--out", str(tmp_path / "speed.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert asked == [(0, 16), (1, 24), (2, 24), (0, 24), (1, 24), (2, 24)]
