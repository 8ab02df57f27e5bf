"""The model runner's sequence lifecycle: add, fork, commit with rollback, release."""

import pytest
import torch

from bass.core.config import RunnerConfig
from bass.core.errors import CacheFullError, InvalidRequestError, SequenceTooLongError, UnknownSequenceError
from bass.core.worker_api import AddSequence
from bass.engine.runner import ModelRunner


@pytest.fixture
def runner(llama_target):
    return ModelRunner(RunnerConfig(model_dir=llama_target, num_slots=3, max_seq_len=16))


def test_add_prefills_all_but_last_prompt_token(runner):
    runner.add([AddSequence(1, (5, 6, 7, 8))])
    s = runner.get(1)
    assert s.committed == [5, 6, 7, 8] and runner.cache.tokens(s.slot) == [5, 6, 7]


def test_fork_shares_the_prefill(runner):
    runner.add([AddSequence(1, (5, 6, 7)), AddSequence(2, parent_id=1), AddSequence(3, parent_id=1)])
    slots = {runner.get(i).slot for i in (1, 2, 3)}
    assert len(slots) == 3
    for i in (2, 3):
        s = runner.get(i)
        assert s.committed == [5, 6, 7] and runner.cache.tokens(s.slot) == [5, 6]
        torch.testing.assert_close(runner.cache.k[:, s.slot, :2], runner.cache.k[:, runner.get(1).slot, :2])
    # Forked sequences diverge without touching each other.
    logits = runner.forward([(runner.get(2), [9]), (runner.get(3), [10])], [1, 1])
    assert not torch.allclose(logits[0], logits[1])
    assert runner.cache.tokens(runner.get(2).slot) == [5, 6, 7, 9]
    assert runner.cache.tokens(runner.get(3).slot) == [5, 6, 7, 10]


def test_commit_rolls_back_to_the_first_disagreement(runner):
    runner.add([AddSequence(1, (5, 6))])
    s = runner.get(1)
    runner.forward([(s, [20, 21, 22])], [0])  # cache: 5 6 20 21 22
    runner.commit(s, [20, 21, 30])  # 20, 21 accepted; 30 replaces 22
    assert runner.cache.tokens(s.slot) == [5, 6, 20, 21]
    assert s.committed == [5, 6, 20, 21, 30]
    runner.forward([(s, [])], [0])  # pending 30 runs
    runner.commit(s, [31, 32])  # tokens committed by the other model: nothing to roll back
    assert runner.cache.tokens(s.slot) == [5, 6, 20, 21, 30] and s.committed[-2:] == [31, 32]


def test_full_cache_is_all_or_nothing(runner):
    runner.add([AddSequence(1, (5,)), AddSequence(2, parent_id=1)])
    with pytest.raises(CacheFullError):
        runner.add([AddSequence(3, (6, 7)), AddSequence(4, parent_id=3)])
    assert set(runner.sequences) == {1, 2} and runner.cache.free_slots == 1
    runner.release([1, 2, 1])  # idempotent
    assert runner.cache.free_slots == 3
    runner.add([AddSequence(3, (6, 7)), AddSequence(4, parent_id=3), AddSequence(5, parent_id=3)])
    assert runner.cache.free_slots == 0


def test_bad_input_is_refused_clearly(runner):
    with pytest.raises(InvalidRequestError, match="prompt_ids.*vocabulary"):
        runner.add([AddSequence(1, (5, 10_000))])
    with pytest.raises(InvalidRequestError, match="prompt_ids: must not be empty"):
        runner.add([AddSequence(1, ())])
    with pytest.raises(SequenceTooLongError):
        runner.add([AddSequence(1, tuple(range(1, 20)))])
    runner.add([AddSequence(1, (5,))])
    with pytest.raises(InvalidRequestError, match="already exists"):
        runner.add([AddSequence(1, (5,))])
    with pytest.raises(UnknownSequenceError, match="sequence 9"):
        runner.get(9)
    with pytest.raises(UnknownSequenceError):
        runner.add([AddSequence(2, parent_id=9)])
    assert set(runner.sequences) == {1}


def test_rewind_recomputes_a_cached_token_with_the_same_result(runner):
    runner.add([AddSequence(1, (5, 6, 7))])
    s = runner.get(1)
    direct = runner.forward([(s, [])], [1])
    runner.commit(s, [9])
    assert runner.pending(s) == 1
    runner.rewind(s, 2)
    assert runner.pending(s) == 2 and runner.cache.tokens(s.slot) == [5, 6]
    again = runner.forward([(s, [])], [2])
    torch.testing.assert_close(again[:1], direct, atol=1e-5, rtol=1e-5)
    runner.rewind(s, 99)  # more than is cached: left as it is
    assert runner.cache.tokens(s.slot) == [5, 6, 7, 9] and runner.pending(s) == 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_draft_tokens_fed_from_the_device_are_settled_in_the_cache(runner, temperature):
    """Draft steps after the first take their input ids from the previous step's device tensor;
    afterwards the cache records the real ids (no placeholder), for ragged per-sequence k, and
    the drafts equal those of a step-by-step draft that copies each token to the host."""
    from bass.core.config import SamplingParams
    from bass.core.worker_api import ProposeItem, ProposeRequest, SequenceSampling
    from bass.draft_service.worker import DraftWorker
    from bass.engine.runner import PLACEHOLDER

    worker = DraftWorker(runner, top_n=8)
    sampling = SequenceSampling(SamplingParams(temperature=temperature, top_p=0.9), seed_key=77)
    request = ProposeRequest(items=[ProposeItem(1, 4, (), sampling), ProposeItem(2, 1, (), sampling),
                                    ProposeItem(3, 3, (), sampling)],
                             add=[AddSequence(1, (5, 6, 7)), AddSequence(2, (9, 3)), AddSequence(3, (5, 6, 7, 8))])
    drafts = worker.propose(request).tokens
    assert [len(d) for d in drafts] == [4, 1, 3]
    for seq_id, d in zip((1, 2, 3), drafts):
        state = runner.get(seq_id)
        cached = runner.cache.tokens(state.slot)
        assert PLACEHOLDER not in cached
        assert cached[len(state.committed):] == d[:-1]  # the last draft token never ran
    # The same proposals, one token at a time through the host.
    for seq_id, d in zip((1, 2, 3), drafts):
        state = runner.get(seq_id)
        runner.cache.truncate(state.slot, len(state.committed) - 1)
        step = worker.propose(ProposeRequest(items=[ProposeItem(seq_id, 1, (), sampling)])).tokens[0]
        assert step == d[:1]


def test_tokens_a_step_ahead_ran_from_the_device_are_settled_and_committed_in_one_pass(runner):
    """commit_fed: each sequence's input placeholder (stage_fed) becomes its committed token, as
    settle then commit would make it; a position that is not a sequence's next one changes
    nothing and says so, for the caller's one-by-one path."""
    from bass.engine.runner import PLACEHOLDER

    runner.add([AddSequence(1, (5, 6, 7)), AddSequence(2, (9, 3))])
    states = [runner.get(1), runner.get(2)]
    runner.forward([(s, []) for s in states], [1, 1])  # the pending last prompt tokens
    chunks = runner.stage_fed(states)
    positions = [c.start for c in chunks]
    assert positions == [3, 2] and [runner.cache.tokens(s.slot)[-1] for s in states] == [PLACEHOLDER] * 2
    assert runner.commit_fed(states, positions, [11, 12])
    assert states[0].committed == [5, 6, 7, 11] and states[1].committed == [9, 3, 12]
    assert runner.cache.tokens(states[0].slot) == [5, 6, 7, 11] and runner.cache.tokens(states[1].slot) == [9, 3, 12]
    runner.stage_fed(states)
    assert not runner.commit_fed(states, [3, 3], [13, 14])  # 3 is not sequence 1's next position (4)
    assert states[0].committed == [5, 6, 7, 11] and runner.cache.tokens(states[0].slot) == [5, 6, 7, 11, PLACEHOLDER]
