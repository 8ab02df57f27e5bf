"""The draft's self-feeding loop (engine/draft_loop.py), run eagerly on the CPU: the same step
functions the CUDA graphs capture, on the same static buffers. Its proposals and the cache it
leaves behind must equal the forward-by-forward path's, round after round of commits and
rollbacks, greedy and sampled, at padded batch sizes."""

import pytest
import torch

from bass.core.config import RunnerConfig, SamplingParams
from bass.core.worker_api import AddSequence, ProposeItem, ProposeRequest, SequenceSampling
from bass.draft_service.worker import DraftWorker
from bass.engine.draft_loop import MAX_STEPS, DraftLoopGraphs
from bass.engine.runner import PLACEHOLDER, ModelRunner

PROMPTS = [(5, 6, 7), (9, 3, 4, 4), (11, 12), (20, 21, 22, 23, 24), (7,) * 6]


def make_worker(model_dir, *, prepared: bool, device: str = "cpu") -> DraftWorker:
    """A draft worker whose loop runs eagerly on the CPU, or as captured CUDA graphs (fp32) on a
    GPU; unprepared, the loop never applies, so the worker takes the forward-by-forward path
    (with the same rewinds to a uniform first step, and on a GPU the same one-forward graphs)."""
    gpu = device == "cuda"
    runner = ModelRunner(RunnerConfig(model_dir=model_dir, device=device, num_slots=8, max_seq_len=64,
                                      attention="triton" if gpu else "auto"))
    if gpu:
        worker = DraftWorker(runner, top_n=8)
        if prepared:
            worker.warm_up()
        else:
            runner.warm_up(graph_shapes=[(2, 1), (3, 1), (1, 1)])
            worker.loop = DraftLoopGraphs(runner.model, runner.cache, runner.graphs.scratch_slot, worker.sample)
        return worker
    scratch = runner.cache.allocate()
    worker = DraftWorker(runner, top_n=8)
    worker.loop = DraftLoopGraphs(runner.model, runner.cache, scratch, worker.sample, capture_graphs=False)
    if prepared:
        worker.loop.prepare(max_batch=8)
    return worker


def run_rounds(worker: DraftWorker, samplings: list[SequenceSampling], ks: list[int], calls: list[int]):
    """Rounds of propose + commit: each round commits a prefix of each proposal plus one token
    of its own (full acceptance for some sequences, rejection for others), as verification does."""
    n = len(samplings)
    original = worker.loop.run

    def counting_run(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    worker.loop.run = counting_run
    committed = [() for _ in range(n)]
    add = [AddSequence(i, PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    history = []
    for round_, k in enumerate(ks):
        items = [ProposeItem(i, k, committed[i], samplings[i]) for i in range(n)]
        drafts = worker.propose(ProposeRequest(items=items, add=add if round_ == 0 else ())).tokens
        history.append(drafts)
        caches = [list(worker.runner.cache.tokens(worker.runner.get(i).slot)) for i in range(n)]
        history.append(caches)
        for cache in caches:
            assert PLACEHOLDER not in cache
        # Accept all of sequence i's tokens when (i + round) is even, else the first half, then
        # one token of the "target" (the draft's own next proposal shifted, so it often differs).
        committed = [tuple(d[:len(d) if (i + round_) % 2 == 0 else len(d) // 2]) + ((d[0] + 1 + i) % 200,)
                     for i, d in enumerate(drafts)]
    return history


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("mode", ["greedy", "sampled", "mixed"])
@pytest.mark.parametrize("num_seqs", [1, 3, 5])
def test_loop_proposes_what_the_stepwise_path_proposes(llama_draft, mode, num_seqs, device):
    params = {
        "greedy": [SamplingParams()],
        "sampled": [SamplingParams(temperature=0.9, top_p=0.9), SamplingParams(temperature=1.3, top_k=5)],
        "mixed": [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0)],
    }[mode]
    samplings = [SequenceSampling(params[i % len(params)], seed_key=1000 + i) for i in range(num_seqs)]
    ks = [4, 4, 2, 5, 1, 3]
    looped_calls, stepwise_calls = [], []
    looped = run_rounds(make_worker(llama_draft, prepared=True, device=device), samplings, ks, looped_calls)
    stepwise = run_rounds(make_worker(llama_draft, prepared=False, device=device), samplings, ks, stepwise_calls)
    for i, (got, want) in enumerate(zip(looped, stepwise)):
        what = "drafts" if i % 2 == 0 else "caches"
        assert got == want, f"round {i // 2} {what} differ: looped {got} vs stepwise {want}"
    assert len(looped_calls) == len(ks) and not stepwise_calls  # every round took its path
    assert any(len(set(d)) > 1 for round_ in looped[::2] for d in round_), "drafts should vary"


def test_ragged_lengths_and_long_drafts_take_the_stepwise_path(llama_draft):
    """Per-sequence lengths, and more steps than the graphs hold, run forward by forward."""
    worker = make_worker(llama_draft, prepared=True)
    calls = []
    original = worker.loop.run
    worker.loop.run = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    sampling = SequenceSampling(SamplingParams(), seed_key=1)
    worker.propose(ProposeRequest(items=[ProposeItem(0, 1, (), sampling), ProposeItem(1, 1, (), sampling)],
                                  add=[AddSequence(0, (5, 6, 7)), AddSequence(1, (8, 9))]))
    calls.clear()
    ragged = worker.propose(ProposeRequest(items=[ProposeItem(0, 3, (4,), sampling), ProposeItem(1, 2, (4,), sampling)]))
    assert [len(d) for d in ragged.tokens] == [3, 2] and not calls
    assert not worker.loop.eligible(2, 2, MAX_STEPS + 1, "greedy")
    uniform = worker.propose(ProposeRequest(items=[ProposeItem(0, 2, (7,), sampling), ProposeItem(1, 2, (7,), sampling)]))
    assert [len(d) for d in uniform.tokens] == [2, 2] and calls


def test_loop_refuses_steps_it_cannot_hold(llama_draft):
    worker = make_worker(llama_draft, prepared=True)
    with pytest.raises(ValueError, match="1..32 steps"):
        worker.loop.run([], MAX_STEPS + 1)
    assert torch.equal(worker.loop.buffers[1].index, torch.zeros(1, dtype=torch.int64))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("regular_steps", [3, 6, 20, 40])
def test_a_catch_up_after_regular_steps_brings_the_proposal_back_to_the_loop(llama_draft, regular_steps, device):
    """Each regular step leaves the draft one more token to run (auto's k = 0 probes leave
    three). Up to 33 pending tokens are caught up on in one forward of a captured size
    (CATCH_UP_TOKENS; on a GPU, a graph replay) and the proposal then runs through the
    self-feeding loop; what it proposes, and what the cache holds after, equal the plain
    forward-by-forward worker's (eager, no graphs). Longer stretches keep the forward-by-forward
    path."""
    from bass.draft_service.worker import CATCH_UP_TOKENS

    sampling = SequenceSampling(SamplingParams(), seed_key=1)
    prompts = [tuple(range(5, 21)), tuple(range(50, 66))]  # room to rewind into, within max_seq_len 64

    def two_proposals(worker: DraftWorker):
        calls = []
        if worker.loop is not None:
            original = worker.loop.run
            worker.loop.run = lambda *a, **kw: calls.append(1) or original(*a, **kw)
        first = worker.propose(ProposeRequest(items=[ProposeItem(i, 3, (), sampling) for i in range(2)],
                                              add=[AddSequence(i, p) for i, p in enumerate(prompts)])).tokens
        # the first draft accepted, then tokens the target decoded alone
        regular = [(first[i][0],) + tuple((7 * i + 3 * j) % 200 for j in range(regular_steps)) for i in range(2)]
        calls.clear()
        second = worker.propose(ProposeRequest(items=[ProposeItem(i, 3, regular[i], sampling) for i in range(2)])).tokens
        caches = [list(worker.runner.cache.tokens(worker.runner.get(i).slot)) for i in range(2)]
        return (first, second, caches), calls

    plain = DraftWorker(ModelRunner(RunnerConfig(model_dir=llama_draft, device=device, num_slots=8, max_seq_len=64,
                                                 attention="triton" if device == "cuda" else "auto",
                                                 cuda_graphs=False)), top_n=8)
    assert plain.loop is None
    want, _ = two_proposals(plain)
    worker = make_worker(llama_draft, prepared=True, device=device)
    replayed = []
    if worker.runner.graphs is not None:  # which step shapes replayed a graph
        original_run = worker.runner.graphs.run
        worker.runner.graphs.run = lambda chunks, **kw: replayed.append(len(chunks[0].tokens)) or original_run(chunks, **kw)
    got, calls = two_proposals(worker)
    assert got == want
    caught_up = regular_steps + 1 <= CATCH_UP_TOKENS[-1] + 1
    assert calls == ([1] if caught_up else [])
    if device == "cuda" and regular_steps > 3:
        assert any(q in CATCH_UP_TOKENS for q in replayed) == caught_up
