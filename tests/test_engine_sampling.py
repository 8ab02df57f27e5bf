"""Sampled speculative decoding follows the target's distribution exactly (chi-square), and a
seeded request draws the same tokens whatever else shares its batch."""

import pytest

from bass.coordinator.requests import GenerationRequest
from bass.core.config import RunnerConfig, SamplingParams
from bass.core.errors import WorkerUnavailableError
from bass.core.worker_api import AddSequence
from bass.engine.runner import ModelRunner
from bass.engine.sampling import RowParams, shape_probs
from conftest import build_scheduler
from stats import chi_square_pvalue
from tiny_models import make_model

PROMPT = (5, 17, 33)
SAMPLES = 3000


@pytest.fixture(scope="module")
def stat_models(tmp_path_factory):
    """A target with a peaked distribution (so the test has power), a close draft, an unrelated one."""
    root = tmp_path_factory.mktemp("stat-models")
    target = make_model(root / "target", "llama", seed=11, init_range=0.5)
    good = make_model(root / "good", "llama", seed=12, init_range=0.5, perturb_from=target, perturb_scale=0.15)
    bad = make_model(root / "bad", "llama", seed=13, init_range=0.5)
    return target, {"good": good, "bad": bad}


def target_probs(target, prefix, params):
    runner = ModelRunner(RunnerConfig(model_dir=target, num_slots=1, max_seq_len=32))
    runner.add([AddSequence(1, tuple(prefix))])
    logits = runner.forward([(runner.get(1), [])], [1])
    return shape_probs(logits, RowParams.build([params], "cpu"))[0]


SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk8": SamplingParams(temperature=0.7, top_k=8),
    "topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["good", "bad"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_sampled_tokens_follow_the_target_distribution(stat_models, draft_kind, setting):
    target, drafts = stat_models
    params = SETTINGS[setting]
    scheduler = build_scheduler(target, drafts[draft_kind], "2", num_slots=500, max_batch_size=500, max_n=500,
                                max_seq_len=16, draft_top_n=16)
    per_request = 500
    results = scheduler.generate([
        GenerationRequest(prompt_ids=PROMPT, n=per_request, max_new_tokens=3, sampling=params, seed=seed,
                          ignore_eos=True)
        for seed in range(SAMPLES // per_request)])
    seqs = [s.token_ids for r in results for s in r.sequences]
    assert len(seqs) == SAMPLES and all(len(s) == 3 for s in seqs)
    stats = [r.stats for r in results]
    assert sum(s.draft_tokens for s in stats) > 0

    # First token: its marginal is the target's distribution after the prompt.
    first = [s[0] for s in seqs]
    assert chi_square_pvalue(first, target_probs(target, PROMPT, params).numpy()) > 1e-4
    # Second and third tokens, given the most common prefix before them.
    for pos in (1, 2):
        prefixes = {}
        for s in seqs:
            prefixes.setdefault(tuple(s[:pos]), []).append(s[pos])
        prefix, nexts = max(prefixes.items(), key=lambda kv: len(kv[1]))
        if len(nexts) < 200:
            continue
        expected = target_probs(target, PROMPT + prefix, params).numpy()
        assert chi_square_pvalue(nexts, expected) > 1e-4, f"position {pos} after {prefix}"


@pytest.mark.parametrize("policy", ["3", "adaptive", "bass"])
def test_seeded_request_is_reproducible_across_batch_compositions(llama_target, llama_draft, policy):
    params = SamplingParams(temperature=0.9, top_p=0.95)
    mine = GenerationRequest(prompt_ids=(5, 17, 33, 200), n=3, max_new_tokens=16, sampling=params, seed=1234,
                             ignore_eos=True)
    alone = build_scheduler(llama_target, llama_draft, policy).generate([mine])[0]
    others = [GenerationRequest(prompt_ids=tuple(range(1, 2 + i * 5)), n=2, max_new_tokens=10 + i,
                                sampling=SamplingParams(temperature=1.0), ignore_eos=True) for i in range(3)]
    crowded = build_scheduler(llama_target, llama_draft, policy).generate(others[:2] + [mine] + others[2:])[2]
    assert [s.token_ids for s in crowded.sequences] == [s.token_ids for s in alone.sequences]
    # the n samples differ from each other, and another seed gives other text
    assert len({tuple(s.token_ids) for s in alone.sequences}) == 3
    other_seed = build_scheduler(llama_target, llama_draft, policy).generate(
        [GenerationRequest(**{**mine.__dict__, "seed": 99})])[0]
    assert [s.token_ids for s in other_seed.sequences] != [s.token_ids for s in alone.sequences]


def test_unseeded_requests_differ(llama_target, llama_draft):
    req = GenerationRequest(prompt_ids=(5, 17), max_new_tokens=12, sampling=SamplingParams(temperature=1.0),
                            ignore_eos=True)
    s = build_scheduler(llama_target, llama_draft, "3")
    a, b = s.generate([req, req])
    assert a.sequences[0].token_ids != b.sequences[0].token_ids


class FlakyDraft:
    """A draft worker that fails its `fail_at`-th Propose (as if the service died) and answers
    again afterwards (as if it was restarted, holding nothing)."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, request):
        self._count()
        return self.inner.propose(request)

    def start_propose(self, request):  # in-process, the scheduler starts proposals this way
        self._count()
        return self.inner.start_propose(request)

    def _count(self):
        self.calls += 1
        if self.calls == self.fail_at:
            self.inner.reset()
            raise WorkerUnavailableError("draft killed (test)")


SEEDED = GenerationRequest(prompt_ids=(5, 17, 33, 200), n=2, max_new_tokens=24, seed=7, ignore_eos=True,
                           sampling=SamplingParams(temperature=0.8, top_p=0.95))


def _tokens(result):
    return [s.token_ids for s in result.sequences]


def test_seeded_text_is_the_same_with_or_without_speculation(llama_target, llama_draft):
    """Every position is the target's Gumbel race under the sequence's key: a fixed k of 1, 4 or
    8, every policy, regular decoding (k = 0) and no draft at all give the same tokens."""
    reference = _tokens(build_scheduler(llama_target, None, "0").generate([SEEDED])[0])
    texts = {policy: _tokens(build_scheduler(llama_target, llama_draft, policy).generate([SEEDED])[0])
             for policy in ("0", "1", "4", "8", "auto", "bass", "adaptive")}
    assert all(t == reference for t in texts.values()), texts
    assert len({tuple(t) for t in reference}) == 2  # the two samples differ


def test_seeded_text_is_the_same_when_cuts_fall_outside_the_window(llama_target, llama_draft, monkeypatch):
    """The target races each step without a mid-step sync, from each row's CUT_WINDOW largest
    logits; rows whose top-p cut lies beyond them make it run the step's exact race again.
    With a window of 2 most steps take that path, and the tokens are the same."""
    import bass.engine.sampling as sampling
    import bass.target_service.worker as target_worker

    reference = _tokens(build_scheduler(llama_target, llama_draft, "4").generate([SEEDED])[0])
    exact_races = []
    monkeypatch.setattr(sampling, "CUT_WINDOW", 2)
    monkeypatch.setattr(target_worker, "race", lambda *a: exact_races.append(1) or sampling.race(*a))
    assert _tokens(build_scheduler(llama_target, llama_draft, "4").generate([SEEDED])[0]) == reference
    assert len(exact_races) >= 5


def test_seeded_text_survives_a_crowded_batch_and_a_draft_restart(llama_target, llama_draft):
    reference = _tokens(build_scheduler(llama_target, None, "0").generate([SEEDED])[0])
    # In a batch of 16 sequences with other sampled and greedy requests, under auto.
    others = [GenerationRequest(prompt_ids=tuple(range(1, 3 + 3 * i)), n=2, max_new_tokens=8 + 3 * i,
                                sampling=SamplingParams(temperature=1.0 if i % 2 else 0.0), ignore_eos=True)
              for i in range(7)]
    crowded = build_scheduler(llama_target, llama_draft, "auto").generate(others[:3] + [SEEDED] + others[3:])
    assert sum(len(r.sequences) for r in crowded) == 16
    assert _tokens(crowded[3]) == reference
    # The draft dies on its third Propose and is back at once: the scheduler decodes regularly,
    # reconnects, and the sequences rejoin the draft; the text does not change.
    scheduler = build_scheduler(llama_target, llama_draft, "4")
    scheduler.reconnect_interval_s = 0.0
    scheduler.draft = FlakyDraft(scheduler.draft, fail_at=3)
    result = scheduler.generate([SEEDED])[0]
    assert scheduler.draft.calls > 3 and result.stats.draft_tokens > 0
    assert _tokens(result) == reference


@pytest.mark.parametrize("policy", ["4", "auto"])
def test_tokens_do_not_depend_on_the_prefill_budget(llama_target, llama_draft, policy):
    """A budget below every prompt, while a request speculates: newcomers are admitted one per
    step and join the draft one per step, so sequences decode without drafts at first and
    join at different points. Greedy and seeded tokens stay those of each request sent alone
    with regular decoding."""
    requests = [SEEDED] + [
        GenerationRequest(prompt_ids=tuple(range(1, 8 + 5 * i)), n=2, max_new_tokens=10 + 3 * i, seed=i,
                          sampling=SamplingParams(temperature=0.9 if i % 2 else 0.0, top_p=0.95), ignore_eos=True)
        for i in range(4)]
    alone = [_tokens(build_scheduler(llama_target, None, "0").generate([r])[0]) for r in requests]
    s = build_scheduler(llama_target, llama_draft, policy, prefill_budget=5)
    runs = [s.submit(requests[0])]
    s.step()
    runs += [s.submit(r) for r in requests[1:]]
    admitted = []
    while s.has_work:
        waiting = len(s.waiting)
        s.step()
        admitted.append(waiting - len(s.waiting))
    assert admitted[:len(runs) - 1] == [1] * (len(runs) - 1)
    assert [_tokens(r.result) for r in runs] == alone
    if policy == "4":
        assert all(r.result.stats.draft_tokens > 0 for r in runs)
