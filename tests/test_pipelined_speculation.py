"""Pipelined speculation (coordinator/pipelined_step.py, issue #36): the draft proposes past the
block the target verifies at the same time. Whatever the draft proposes, and whichever blocks turn
out to be stand-ins, the text must be the target's own decoding token for token, greedy and
seeded; the draft's cache must roll back to the committed tokens where a block failed; a draft
that dies mid-pipeline, cancellations and arrivals must change nothing but the speed. In-process
on the CPU (fp32) and through the real services in separate processes (the draft's `assumed`
tokens travel over gRPC)."""

import pytest

from bass.app.client import BassClient
from bass.core.config import SamplingParams
from bass.coordinator.requests import GenerationRequest
from bass.core.worker_api import AddSequence, ProposeItem, ProposeRequest, SequenceSampling
from conftest import build_scheduler
from services import start_services
from test_device_drafts import REQUESTS as DEVICE_REQUESTS
from test_draft_loop import make_worker
from test_engine_sampling import FlakyDraft

# Greedy and sampled, n = 1 and 2 (test_device_drafts), and a longer prompt.
REQUESTS = DEVICE_REQUESTS + [
    GenerationRequest(prompt_ids=tuple(range(60, 75)), max_new_tokens=9, ignore_eos=True),
]


def texts(results):
    return [[s.token_ids for s in r.sequences] for r in results]


@pytest.fixture(scope="module")
def regular(llama_target):
    """The target's own decoding of REQUESTS, batched as the pipelined runs batch them."""
    return texts(build_scheduler(llama_target, None, "0").generate(REQUESTS))


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("draft", ["llama_draft", "llama_bad_draft"])
def test_text_is_the_targets_own_greedy_and_seeded(llama_target, draft, k, regular, request):
    """A draft that agrees often (most blocks used) and one that rarely does (most blocks
    stand-ins, many rollbacks): the same text as regular decoding, and the draft really proposed
    (blocks were verified) in both."""
    s = build_scheduler(llama_target, request.getfixturevalue(draft), pipeline=k)
    results = s.generate(REQUESTS)
    assert texts(results) == regular
    assert s.step_stats.draft_forwards > 0
    if draft == "llama_draft":  # blocks used, some accepted and some cut short (the draft rolled back)
        assert sum(r.stats.accepted_tokens for r in results) > 0, "no block was ever used"
        assert sum(r.stats.rejections for r in results) > 0, "no block was ever rejected"


def test_an_identical_draft_covers_k_tokens_a_step(llama_target):
    """With the target as its own draft (greedy), every block is accepted whole and every guess
    of the token after it is right: after the first step each step commits k tokens a sequence,
    where sequential speculation with k - 1 drafts commits k too, and regular decoding one."""
    k, new = 4, 41
    request = GenerationRequest(prompt_ids=(3, 1, 4, 1, 5), max_new_tokens=new, ignore_eos=True)
    want = texts(build_scheduler(llama_target, None, "0").generate([request]))
    s = build_scheduler(llama_target, llama_target, pipeline=k)
    result = s.generate([request])[0]
    assert texts([result]) == want
    assert result.stats.accepted_tokens == result.stats.draft_tokens > 0
    # The first step verifies stand-ins (nothing was proposed yet): one token; then k a step.
    assert s.step_stats.steps <= 1 + -(-(new - 1) // k) + 1, s.step_stats.steps


def test_the_draft_rolls_back_what_it_assumed(llama_target):
    """DraftWorker with `assumed` tokens: it proposes after them as if committed, and its next
    call forgets them before committing what the target decided, so its cache record is the
    committed tokens (plus what it ran for its new proposal), never a rejected block."""
    worker = make_worker(llama_target, prepared=True)
    greedy = SequenceSampling(SamplingParams(), seed_key=1)
    worker.propose(ProposeRequest(items=[], add=[AddSequence(1, (5, 6, 7, 8))]))
    runner = worker.runner
    first = worker.propose(ProposeRequest(items=[ProposeItem(1, 3, (), greedy, assumed=(11, 12))])).tokens[0]
    state = runner.get(1)
    assert state.committed == [5, 6, 7, 8, 11, 12]
    # The proposal after the assumed block is the one made with that block committed.
    twin = make_worker(llama_target, prepared=True)
    twin.propose(ProposeRequest(items=[], add=[AddSequence(1, (5, 6, 7, 8, 11, 12))]))
    assert twin.propose(ProposeRequest(items=[ProposeItem(1, 3, (), greedy)])).tokens[0] == first
    # The target took 11 and then 99, not 12: the block is forgotten, 11 and 99 committed.
    worker.propose(ProposeRequest(items=[ProposeItem(1, 2, (11, 99), greedy)]))
    assert state.committed == [5, 6, 7, 8, 11, 99]
    cached = runner.cache.tokens(state.slot)
    assert cached[:6] == [5, 6, 7, 8, 11, 99] and 12 not in cached[4:6]


def test_a_draft_that_dies_mid_pipeline_changes_nothing_but_speed(llama_target, llama_draft, regular):
    s = build_scheduler(llama_target, llama_draft, pipeline=3)
    s.reconnect_interval_s = 0.0
    s.draft = FlakyDraft(s.draft, fail_at=3)
    results = s.generate(REQUESTS)
    assert texts(results) == regular
    assert s.draft.calls > 3, "the draft was not taken back after it came back"


def test_cancelled_and_arriving_requests_mid_pipeline(llama_target, llama_draft):
    """A request cancelled between steps leaves; one arriving later joins with stand-ins first;
    the others' text is unchanged, and every slot on both workers is free at the end."""
    s = build_scheduler(llama_target, llama_draft, pipeline=3)
    first, cancelled, late = REQUESTS[0], REQUESTS[1], REQUESTS[2]
    want = {id(r): texts(build_scheduler(llama_target, None, "0").generate([r]))[0] for r in (first, late)}
    runs = [s.submit(first), s.submit(cancelled)]
    for _ in range(3):
        s.step()
    s.cancel(runs[1])
    runs.append(s.submit(late))
    while s.has_work:
        s.step()
    s.flush_releases()
    assert [[q.token_ids for q in runs[0].result.sequences]] == [want[id(first)]]
    assert [[q.token_ids for q in runs[2].result.sequences]] == [want[id(late)]]
    assert not s.target.runner.sequences and not s.draft.runner.sequences


def test_through_separate_services(llama_target, llama_draft, regular):
    """The draft and the target in processes of their own, over gRPC: the same text; the
    coordinator's Propose carries the assumed blocks."""
    services = start_services(llama_target, llama_draft, pipeline=3)
    try:
        with BassClient(services.address, timeout_s=60) as client:
            got = [[list(q.token_ids) for q in client.generate(
                r.prompt_ids, n=r.n, max_new_tokens=r.max_new_tokens, temperature=r.sampling.temperature,
                top_p=r.sampling.top_p, top_k=r.sampling.top_k, seed=r.seed, ignore_eos=True).sequences]
                for r in REQUESTS]
        assert got == regular
    finally:
        services.stop()
