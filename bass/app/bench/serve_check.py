"""Correctness under load, checked from what the client received.

1. References: every distinct deterministic request (greedy, or sampled with a seed) is sent
   alone, one after another, with the unary Generate call, before any load.
2. Each streamed answer under load must then equal its reference token for token, and its
   deltas must add up to the reference's final text.
3. Every stream, deterministic or not, must be whole: each of its n sequence indices 0..n-1
   streams and finishes exactly once, nothing arrives after a sequence's finish, no index
   outside 0..n-1, and the tokens streamed add up to the count in the final stats.
Sampled requests without a seed cannot be compared (they are counted as unchecked, not passed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc

from bass.app.bench.serve_load import to_request
from bass.app.bench.serve_records import RequestRecord
from bass.app.bench.serve_workload import RequestSpec
from bass.app.client import BassClient

MAX_EXAMPLES = 5


@dataclass(frozen=True)
class Answer:
    """A request's sequences in index order: (token ids, text) each; token ids None where the
    protocol returns none (OpenAI's: then the text alone is compared)."""

    sequences: tuple[tuple[tuple[int, ...], str], ...]


@dataclass(frozen=True)
class ReferenceFailure:
    status: str
    detail: str


def collect_references(address: str, specs: Iterable[RequestSpec], *, timeout_s: float = 600.0,
                       on_done: Callable[[], None] | None = None) -> dict[RequestSpec, Answer | ReferenceFailure]:
    """Each distinct deterministic spec sent alone (sequentially, nothing else in flight)."""
    distinct = list(dict.fromkeys(s for s in specs if s.deterministic))
    out: dict[RequestSpec, Answer | ReferenceFailure] = {}
    with BassClient(address, timeout_s=timeout_s) as client:
        for spec in distinct:
            try:
                response = client.stub.Generate(to_request(spec), timeout=timeout_s)
                out[spec] = Answer(tuple((tuple(s.token_ids), s.text)
                                         for s in sorted(response.sequences, key=lambda s: s.index)))
            except grpc.RpcError as e:
                out[spec] = ReferenceFailure(e.code().name, e.details() or "")
            if on_done:
                on_done()
    return out


def stream_problems(record: RequestRecord) -> list[str]:
    """What is wrong with one completed stream on its own (lost, duplicated or foreign sequences)."""
    problems = []
    n = record.spec.n
    indices = {d.index for d in record.deltas}
    if unknown := sorted(i for i in indices if not 0 <= i < n):
        problems.append(f"unknown sequence indices {unknown} (n = {n})")
    finishes = Counter(d.index for d in record.deltas if d.finish_reason is not None)
    if lost := [i for i in range(n) if finishes[i] == 0]:
        problems.append(f"sequences {lost} never finished")
    if twice := sorted(i for i, c in finishes.items() if c > 1):
        problems.append(f"sequences {twice} finished more than once")
    finished: set[int] = set()
    late = set()
    for d in record.deltas:
        if d.index in finished:
            late.add(d.index)
        if d.finish_reason is not None:
            finished.add(d.index)
    if late:
        problems.append(f"sequences {sorted(late)} streamed after finishing")
    streamed = sum(len(d.token_ids) for d in record.deltas)
    if record.stats_generated_tokens is None:
        problems.append("no final stats message")
    elif streamed != record.stats_generated_tokens:
        problems.append(f"{streamed} tokens streamed, final stats say {record.stats_generated_tokens}")
    if over := [i for i, t in record.tokens_by_index().items() if len(t) > record.spec.max_new_tokens]:
        problems.append(f"sequences {over} exceed max_new_tokens")
    return problems


def answer_problems(record: RequestRecord, reference: Answer) -> tuple[list[str], list[str]]:
    """(token mismatches, text mismatches) of a streamed answer against its reference."""
    tokens, texts = record.tokens_by_index(), record.text_by_index()
    token_problems, text_problems = [], []
    for i, (ref_tokens, ref_text) in enumerate(reference.sequences):
        got = tuple(tokens.get(i, ()))
        if ref_tokens is not None and got != ref_tokens:
            first = next((j for j, (a, b) in enumerate(zip(got, ref_tokens)) if a != b), min(len(got), len(ref_tokens)))
            token_problems.append(f"sequence {i}: tokens differ from the reference at position {first} "
                                  f"({len(got)} vs {len(ref_tokens)} tokens)")
        elif texts.get(i, "") != ref_text:
            text_problems.append(f"sequence {i}: streamed text does not add up to the reference text")
    return token_problems, text_problems


def check_run(records: list[RequestRecord], references: dict[RequestSpec, Answer | ReferenceFailure]) -> dict:
    """Per kind of problem, how many completed requests of one run have it; `mismatches` counts
    the requests with any problem (each once); a few examples say what went wrong."""
    counts = Counter()
    examples: list[str] = []
    bad = 0

    for r in records:
        if not r.ok:
            continue
        found = {"broken_streams": stream_problems(r)}
        if not r.spec.deterministic:
            counts["unchecked_unseeded"] += 1
        elif not isinstance(reference := references.get(r.spec), Answer):
            counts["unchecked_no_reference"] += 1
        else:
            kind = "greedy" if r.spec.temperature == 0 else "seeded"
            counts[f"{kind}_checked"] += 1
            found[f"{kind}_mismatches"], found["text_mismatches"] = answer_problems(r, reference)
        problems = {k: v for k, v in found.items() if v}
        counts.update(problems.keys())
        bad += bool(problems)
        for kind, what in problems.items():
            if len(examples) < MAX_EXAMPLES:
                examples.append(f"{kind}: {r.spec.prompt.id} sent at {r.sent_s:.3f} s: {what[0]}")
    keys = ("greedy_checked", "greedy_mismatches", "seeded_checked", "seeded_mismatches", "text_mismatches",
            "broken_streams", "unchecked_unseeded", "unchecked_no_reference")
    return {**{k: counts[k] for k in keys}, "mismatches": bad, "examples": examples}
