"""In-process, the next step's proposal is chained behind each verification (DraftWorker.
start_chained): queued before the host reads the verdicts, its first forward takes each
sequence's last two committed tokens and their positions from the verdicts on the device.

The draft's self-feeding loop runs eagerly here (the functions its CUDA graphs capture). What
must hold: the text is the unchained path's token for token; with a fixed draft length the
draft proposes exactly what it proposes unchained (so its cache holds the same keys and values);
the draft's cache record is exact after every reconcile, also where the target revises a
verdict after the device had it; arrivals still join."""

import pytest
import torch

from bass.coordinator.requests import GenerationRequest
from bass.core.config import SamplingParams
from bass.core.worker_api import AddSequence, ProposeItem, ProposeRequest, SequenceSampling
from bass.draft_service.worker import DraftWorker
from bass.engine import sampling
from bass.engine.draft_loop import DraftLoopGraphs
from bass.engine.runner import PLACEHOLDER
from conftest import build_gpu_scheduler, build_scheduler
from test_device_drafts import REQUESTS  # greedy and sampled, n = 1 and 2
from test_draft_loop import make_worker


def with_eager_loop(scheduler):
    """Give the CPU draft worker its self-feeding loop, run eagerly (as on a GPU, captured)."""
    draft: DraftWorker = scheduler.draft
    runner = draft.runner
    draft.loop = DraftLoopGraphs(runner.model, runner.cache, runner.cache.allocate(), draft.sample,
                                 capture_graphs=False)
    draft.loop.prepare(max_batch=16)
    return scheduler


class CheckedDraft:
    """The draft worker, counting chained proposals and checking after each reconcile that the
    cache record of every sequence is its committed tokens plus the k - 1 fed drafts, or a
    prefix of its committed tokens (where the chain could not be kept)."""

    def __init__(self, inner):
        self.inner, self.chained, self.kept = inner, 0, 0
        self.tails = []  # the lookup tokens each chained proposal ran after

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start_chained(self, request, verdicts, verified_k, tail=0):
        chained = self.inner.start_chained(request, verdicts, verified_k, tail)
        self.tails.append(tail)
        self.chained += 1
        outer, runner = self, self.inner.runner

        class Checked:
            k, seq_ids, queued = chained.k, chained.seq_ids, chained.queued

            @property
            def gpu_s(self):
                return chained.gpu_s

            def reconcile(self, emitted, revised=()):
                chained.reconcile(emitted, revised)
                for seq_id in chained.seq_ids:
                    state = runner.get(seq_id)
                    cached = runner.cache.tokens(state.slot)
                    if cached == state.committed + [PLACEHOLDER] * (chained.k - 1):
                        outer.kept += 1
                    else:
                        assert len(cached) <= len(state.committed) and cached == state.committed[:len(cached)]

            def select(self, seq_ids):
                return chained.select(seq_ids)

        return Checked()


# Prompts that repeat themselves (the tiny random models also fall into loops), so that lookups
# find their tokens: greedy, and sampled at a low temperature.
REPETITIVE = [
    GenerationRequest(prompt_ids=(5, 17, 33, 5, 17, 33, 5, 17), max_new_tokens=40, ignore_eos=True),
    GenerationRequest(prompt_ids=(9, 8, 7, 9, 8, 7, 9), n=2, max_new_tokens=30, ignore_eos=True, seed=4,
                      sampling=SamplingParams(temperature=0.3)),
]


def texts(results):
    return [[s.token_ids for s in r.sequences] for r in results]


def pair(target, draft, policy, **kw):
    unchained = with_eager_loop(build_scheduler(target, draft, policy, **kw))
    unchained.speculative.chains = False
    chained = with_eager_loop(build_scheduler(target, draft, policy, **kw))
    chained.draft = CheckedDraft(chained.draft)
    return unchained, chained


@pytest.mark.parametrize("policy", ["3", "bass", "auto"])
def test_chained_proposals_give_the_unchained_text(llama_target, llama_draft, policy):
    unchained, chained = pair(llama_target, llama_draft, policy)
    want = unchained.generate(REQUESTS)
    got = chained.generate(REQUESTS)
    assert texts(got) == texts(want)
    # auto spends steps timing regular decoding and probing, so it chains fewer.
    assert chained.draft.chained >= (3 if policy == "auto" else 5) and chained.draft.kept > 0, "the chained path ran"
    # The step statistics count the steps that took a chained proposal (the last one chained
    # may go unused: its batch finished) and none without chaining.
    assert chained.draft.chained - 1 <= chained.step_stats.chained_steps <= chained.draft.chained
    assert unchained.step_stats.chained_steps == 0
    if policy == "3":
        # One draft length throughout: the chained draft proposes what the unchained one does,
        # token for token, so it ran from the same cached keys and values.
        for a, b in zip(got, want):
            assert (a.stats.draft_tokens, a.stats.accepted_tokens, a.stats.rejections) == \
                   (b.stats.draft_tokens, b.stats.accepted_tokens, b.stats.rejections)
            assert a.stats.rejections > 0 or a.stats.accepted_tokens > 0


def test_verdicts_the_target_revises_leave_the_draft_consistent(llama_target, llama_draft, monkeypatch):
    """A window of 2 makes the target decide most sampled rows again on the host, after the
    chained proposal ran from its first verdicts: those sequences' chained cache is dropped,
    and the text is still the unchained path's."""
    monkeypatch.setattr(sampling, "CUT_WINDOW", 2)
    unchained, chained = pair(llama_target, llama_draft, "3")
    revised = []
    original = chained.target.start_verify

    def start_verify(request, drafts=None):
        pending = original(request, drafts)
        inner_result = pending.result

        def result():
            response = inner_result()
            revised.extend(pending.revised)
            return response

        pending.result = result
        return pending

    chained.target.start_verify = start_verify
    requests = REQUESTS[1:]
    assert texts(chained.generate(requests)) == texts(unchained.generate(requests))
    assert revised, "some verdicts were revised on the host"
    assert chained.draft.chained >= 3


def test_arrivals_join_a_chained_batch(llama_target, llama_draft):
    """Requests that arrive while steps are chained are admitted within a step or two, and
    everyone's text is what it is alone (fp32: no batch-dependent rounding)."""
    alone = [texts(with_eager_loop(build_scheduler(llama_target, llama_draft, "3")).generate([r]))[0]
             for r in REQUESTS]
    s = with_eager_loop(build_scheduler(llama_target, llama_draft, "3"))
    s.draft = CheckedDraft(s.draft)
    runs = [s.submit(REQUESTS[0])]
    for _ in range(3):
        s.step()
    runs.append(s.submit(REQUESTS[1]))
    steps_to_admit = 0
    while runs[1].started is None:
        s.step()
        steps_to_admit += 1
    assert steps_to_admit <= 2
    runs.append(s.submit(REQUESTS[2]))
    while s.has_work:
        s.step()
    s.flush_releases()
    assert [texts([r.result])[0] for r in runs] == alone
    assert s.draft.chained >= 3
    assert not s.draft.runner.sequences, "every sequence released from the draft"


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                       reason="needs CUDA")])


def chain_after_verdicts(llama_draft, device, mode, prompts, K, k2, emit, tail=0, seed=70):
    """A draft worker proposes K tokens for each prompt; `emit(drafts)` gives what the target's
    verification of them (and of `tail` lookup tokens after them) emitted per sequence. Chained
    on those verdicts (device), reconciled and read, the next proposal of k2 and the cache
    record must equal those of a worker told the committed tokens in its next Propose (the
    positions, inputs and noise keys all moved by the device). Returns (proposal, its tokens)."""
    params = SamplingParams() if mode == "greedy" else SamplingParams(temperature=0.9, top_p=0.9)
    samplings = [SequenceSampling(params, seed_key=seed + i) for i in range(len(prompts))]
    ids = range(len(prompts))
    chained, reference = (make_worker(llama_draft, prepared=True, device=device) for _ in range(2))
    first = ProposeRequest(items=[ProposeItem(i, K, (), samplings[i]) for i in ids],
                           add=[AddSequence(i, prompts[i]) for i in ids])
    drafts = chained.propose(first).tokens
    assert drafts == reference.propose(first).tokens
    emitted = emit(drafts)
    width = 1 + K + tail + 1
    verdicts = torch.tensor([[len(e) - 1] + e + [0] * (width - 1 - len(e)) for e in emitted], device=device)
    request = ProposeRequest(items=[ProposeItem(i, k2, (), samplings[i]) for i in ids])
    assert chained.chains(len(prompts), k2, K + tail, mode == "sampled", tail)
    proposal = chained.start_chained(request, verdicts, K + tail, tail)
    proposal.reconcile(emitted)
    got = proposal.select(list(ids)).result().tokens
    want = reference.propose(ProposeRequest(
        items=[ProposeItem(i, k2, tuple(emitted[i]), samplings[i]) for i in ids])).tokens
    assert got == want
    for i in ids:
        a, b = chained.runner.get(i), reference.runner.get(i)
        assert a.committed == b.committed
        assert chained.runner.cache.tokens(a.slot) == reference.runner.cache.tokens(b.slot)
    return proposal, want


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_a_chained_proposal_is_the_proposal_after_committing_the_verdicts(llama_draft, mode, device):
    """After one proposal of K = 3, verdicts accepting 0, 1 and all 3 drafts (then a token of
    the target's)."""
    proposal, want = chain_after_verdicts(
        llama_draft, device, mode, [(5, 6, 7), (9, 3, 4, 4), (11, 12)], K=3, k2=4,
        emit=lambda d: [[(d[0][0] + 1) % 200], d[1][:1] + [(d[1][1] + 7) % 200], d[2] + [17]])
    # A subset in another order reads the same rows.
    assert proposal.select([2, 0]).result().tokens == [want[2], want[0]]
    assert proposal.select([2, 0]).on_device.tolist() == [want[2], want[0]]


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_a_chained_proposal_after_lookup_tokens_is_the_proposal_after_committing_them(llama_draft, mode, device):
    """The target verified K = 3 drafts and then 2 lookup tokens of its own (lookup_tail), which
    the draft never ran. Verdicts accepting none, all 3 drafts, and the drafts with 1 and 2 of
    the lookup tokens: chained on them, the first forward re-runs the last 4 committed tokens."""
    chain_after_verdicts(
        llama_draft, device, mode, [(5, 6, 7), (9, 3, 4, 4), (11, 12, 13), (21, 22, 23, 24, 25)], K=3, k2=3,
        emit=lambda d: [[(d[0][0] + 1) % 200], d[1] + [17], d[2] + [30, 31], d[3] + [40, 41, 42]], tail=2, seed=80)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("prompts,tail", [
    ([(5, 6, 7, 8, 9, 10, 11, 12)], 6),
    ([(5, 6, 7, 8, 9, 10, 11, 12), (30, 31, 32, 33, 34, 35, 36, 37, 38)], 4),
], ids=["one-sequence-tail-6", "two-sequences-tail-4"])
def test_a_chained_proposal_after_a_long_lookup_tail(llama_draft, mode, device, prompts, tail):
    """At one or two sequences a target may verify up to 6 lookup tokens after the drafts
    (draft_loop.max_lookup_tail): the chained first forward re-runs up to 8 committed tokens a
    sequence. Verdicts taking every lookup token, and taking some of them."""
    k = 2 if tail == 6 else 3
    emit = {6: lambda d: [d[0] + [50, 51, 52, 53, 54, 55, 56]],
            4: lambda d: [d[0] + [60, 61, 62], d[1] + [70, 71, 72, 73, 74]]}[tail]
    chain_after_verdicts(llama_draft, device, mode, prompts, K=k, k2=3, emit=emit, tail=tail, seed=90)


def test_long_lookup_tails_fit_the_draft_s_captured_windows():
    """The target's cap on lookup tokens (max_lookup_tail) and the draft's captured first
    forwards (first_windows) agree at every batch size: whatever the target appends, the
    proposal chained behind it replays a graph within the few-row path's 16 rows."""
    from bass.core.config import MAX_LOOKUP_TAIL
    from bass.engine.draft_loop import CHAINED_FIRST_TOKENS, first_windows, max_lookup_tail
    from bass.engine.graphs import BATCH_BUCKETS, DecodeGraphs

    assert [max_lookup_tail(n) for n in (1, 2, 3, 4, 5, 8, 64)] == [6, 6, 2, 2, 0, 0, 0]
    assert MAX_LOOKUP_TAIL == 6
    for n in range(1, BATCH_BUCKETS[-1] + 1):
        bucket, m = DecodeGraphs.bucket(n), max_lookup_tail(n)
        windows = first_windows(bucket)
        assert {2, 3} <= set(windows), "a proposal's own first forwards are captured at every bucket"
        assert all(CHAINED_FIRST_TOKENS + t in windows for t in range(m + 1))
        assert bucket * (CHAINED_FIRST_TOKENS + m) <= 16 or m == 0
    # Windows past 3 are captured only where they stay within 16 rows.
    assert first_windows(8) == (2, 3) and first_windows(4) == (2, 3, 4) and first_windows(1)[-1] == 8


def test_a_long_lookup_tail_keeps_the_text_and_the_chain(llama_target, llama_draft):
    """lookup_tail = 6 in-process, each repetitive request alone: at two sequences up to 5 lookup
    tokens follow k = 3 drafts (the verification graphs' 8), at one sequence 4 (a verification
    of 8 rows). The text is regular decoding's, and proposals are chained behind verifications
    with that many lookup tokens, never more."""
    for request in REPETITIVE:
        want = texts(build_scheduler(llama_target, None, "0").generate([request]))
        s = with_eager_loop(build_scheduler(llama_target, llama_draft, "3", lookup_tail=6))
        s.draft = CheckedDraft(s.draft)
        assert texts(s.generate([request])) == want
        longest = 4 if request.n == 1 else 5
        assert max(s.draft.tails) == longest, (request.n, s.draft.tails)
        assert s.draft.kept >= s.draft.chained // 2, (s.draft.kept, s.draft.chained)


def test_lookup_tokens_the_target_verifies_keep_the_text_and_the_chain(llama_target, llama_draft):
    """In-process with the target's lookup_tail: after each proposal the target verifies 2
    lookup tokens too; the text is regular decoding's (greedy and sampled), the target takes
    some of them, and proposals are still chained behind those verifications."""
    want = texts(build_scheduler(llama_target, None, "0").generate(REPETITIVE))
    s = with_eager_loop(build_scheduler(llama_target, llama_draft, "3", lookup_tail=2))
    s.draft = CheckedDraft(s.draft)
    got = s.generate(REPETITIVE)
    assert texts(got) == want
    assert s.step_stats.lookup_tail_kept > 0, "the target took some lookup tokens"
    assert 2 in s.draft.tails, "proposals were chained behind verifications with lookups"
    # ...and the draft's cache record stayed exact through them (3 sequences a chain, most steps).
    assert s.draft.kept >= 2 * s.draft.chained, (s.draft.kept, s.draft.chained)
    # Without the draft's graphs (the CPU's services, `make demo`) nothing is chained: the next
    # proposal catches the draft up on the lookup tokens it never ran.
    plain = build_scheduler(llama_target, llama_draft, "3", lookup_tail=2)
    assert texts(plain.generate(REPETITIVE)) == want and plain.step_stats.lookup_tail_kept > 0
    # The draft's acceptance counts its own tokens only.
    assert all(r.stats.accepted_tokens <= r.stats.draft_tokens for r in got)


def test_a_chained_proposal_refuses_what_the_graphs_do_not_run(llama_draft):
    worker = make_worker(llama_draft, prepared=True)
    sampling_ = SequenceSampling(SamplingParams(), seed_key=1)
    worker.propose(ProposeRequest(items=[ProposeItem(1, 2, (), sampling_)], add=[AddSequence(1, (5, 6, 7))]))
    verdicts = torch.tensor([[0, 3, 0, 0]])
    assert not worker.chains(1, 40, 2, False)
    with pytest.raises(ValueError, match="same k"):
        worker.start_chained(ProposeRequest(items=[ProposeItem(1, 2, (4,), sampling_)]), verdicts, 2)
    assert not make_worker(llama_draft, prepared=False).chains(1, 2, 2, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["3", "bass"])
def test_chained_proposals_through_cuda_graphs_give_the_unchained_text(llama_target, llama_draft, policy):
    """fp32 on the GPU with CUDA graphs (the services' default shapes): chained proposals
    replay the draft's captured graphs behind the target's captured verification and sampled
    tail; the text, and with a fixed length every proposal, is the unchained path's."""
    unchained = build_gpu_scheduler(llama_target, llama_draft, policy)
    unchained.speculative.chains = False
    want = unchained.generate(REQUESTS)
    chained = build_gpu_scheduler(llama_target, llama_draft, policy)
    chained.draft = CheckedDraft(chained.draft)
    got = chained.generate(REQUESTS)
    assert texts(got) == texts(want)
    assert chained.draft.chained >= 5 and chained.draft.kept > 0
    if policy == "3":
        assert [r.stats.accepted_tokens for r in got] == [r.stats.accepted_tokens for r in want]
