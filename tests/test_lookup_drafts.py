"""Lookup stand-ins (coordinator/lookup_drafts.py): the positions a streamed step's draft leaves
empty verify what followed the last recurrence of the sequence's latest tokens."""

import random
import time
from types import SimpleNamespace

import pytest

from bass.coordinator.draft_ahead import DraftsAhead
from bass.coordinator.lookup_drafts import NgramIndex
from bass.coordinator.streamed_step import StreamedStep, StreamPlan
from bass.core.config import SamplingParams
from bass.core.worker_api import SequenceSampling, Verdict, VerifyResponse
from conftest import build_scheduler
from test_streamed_speculation import REQUESTS, texts

GREEDY = SequenceSampling(SamplingParams(), seed_key=1)


def reference(tokens: list[int], suffix: list[int], count: int, longest: int) -> tuple[int, ...]:
    """By a scan: the tokens after the latest occurrence, followed by a token, of the longest of
    the suffix's last n tokens to occur in `tokens`."""
    for n in range(min(longest, len(suffix)), 0, -1):
        pattern = suffix[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # an occurrence ending before the last token
            if tokens[end - n:end] == pattern:
                return tuple(tokens[end:end + count])
    return ()


def test_the_continuation_follows_the_latest_earlier_occurrence_of_the_longest_match():
    index = NgramIndex(3)
    index.extend([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3])
    assert index.continuation(index.tokens, 3) == (7, 5, 1)  # not 9: the later occurrence wins
    index = NgramIndex(3)
    index.extend([1, 2, 3, 4, 9, 3, 8, 1, 2, 3])
    assert index.continuation(index.tokens, 2) == (4, 9)  # (1, 2, 3) beats the later (3,) -> 8
    assert index.continuation([5, 3], 2) == (8, 1)  # only (3,) occurs: its latest continuation


def test_the_last_tokens_do_not_match_themselves_and_nothing_is_found_where_nothing_recurs():
    index = NgramIndex(3)
    index.extend([5, 6, 7])
    assert index.continuation(index.tokens, 4) == ()
    assert index.continuation([6], 4) == (7,)  # shorter than asked: what there is
    assert index.continuation([5], 0) == ()
    assert NgramIndex(2).continuation([1], 3) == ()


def test_tokens_appended_later_are_found_and_the_suffix_may_run_past_the_indexed_tokens():
    index = NgramIndex(2)
    index.extend([4, 5, 6])
    index.extend([4, 5])
    assert index.continuation(index.tokens, 3) == (6, 4, 5)
    index.extend([8])
    assert index.continuation(index.tokens + [4], 2) == (5, 8)  # a draft's 4 after the indexed 8: its latest 4


def test_an_index_built_in_pieces_answers_as_a_scan_of_the_whole():
    draw = random.Random(7)
    for _ in range(200):
        longest = draw.randint(1, 4)
        tokens = [draw.randint(0, 5) for _ in range(draw.randint(0, 40))]
        index, at = NgramIndex(longest), 0
        while at < len(tokens):  # appended a few at a time, as commits come
            step = draw.randint(1, 4)
            index.extend(tokens[at:at + step])
            at += step
            suffix = tokens[:at] + [draw.randint(0, 5) for _ in range(draw.randint(0, 2))]
            count = draw.randint(1, 5)
            assert index.continuation(suffix, count) == reference(tokens[:at], suffix, count, longest), \
                (tokens[:at], suffix, count, longest)


def test_an_index_matches_at_least_one_token():
    with pytest.raises(ValueError):
        NgramIndex(0)


def test_drafts_ahead_looks_up_followed_sequences_only_and_keeps_up_with_commits():
    ahead = DraftsAhead(lookup=3)
    ahead.follow(1, [1, 2, 3, 4, 1, 2])
    assert ahead.lookup(1, (), 3) == (3, 4, 1)
    assert ahead.lookup(1, (3,), 2) == (4, 1)  # after a draft held: its continuation
    assert ahead.lookup(2, (), 3) == ()  # not followed
    ahead.commit(1, [7, 8, 1, 2])
    assert ahead.lookup(1, (), 2) == (7, 8)  # the latest recurrence of (1, 2) is the committed one
    assert DraftsAhead(lookup=0).lookup(1, (), 3) == ()


class RecordingTarget:
    """A target that accepts, per sequence, the first `accept` tokens of each block."""

    def __init__(self, accept: int):
        self.accept, self.requests = accept, []

    def verify(self, request):
        self.requests.append(request)
        return VerifyResponse(verdicts=[Verdict(accepted=self.accept, tokens=list(item.draft_tokens[:self.accept]) + [0])
                                        for item in request.items])


class Silent:
    busy_s = 0.0

    def send(self, control):
        pass

    def receive(self, timeout_s=0.0):
        return []

    def close(self):
        pass


@pytest.mark.parametrize("lookup, block", [(3, (3, 4, 1)), (0, (2, 2, 2))])
def test_a_starved_sequence_verifies_its_lookup_and_the_accepted_ones_are_counted(lookup, block):
    target = RecordingTarget(accept=2)
    step = StreamedStep(target, time.perf_counter, block=3, wait_s=0.0, lookup=lookup)
    step.open(Silent())
    prompt = (1, 2, 3, 4, 1, 2)
    seq = SimpleNamespace(seq_id=5, sampling=GREEDY, output=[], request=SimpleNamespace(prompt_ids=prompt))
    step.ahead.follow(5, list(prompt))
    outcome = step.execute(StreamPlan(batch=[seq], rooms=[10], step_started=0.0, target_add=[], target_release=[]))
    assert target.requests[0].items[0].draft_tokens == block
    assert outcome.starved == 1 and outcome.drafts == [()]
    assert (outcome.looked_up, outcome.lookup_kept) == ((3, 2) if lookup else (0, 0))


def test_text_is_the_targets_own_where_only_lookups_are_verified(llama_target, llama_draft):
    """A draft that never sends anything: every position of every step is a lookup or a repeated
    token, and the text is regular decoding's, greedy and seeded. Tiny random models repeat
    themselves, so some lookups are accepted and the steps commit more than one token."""
    regular = texts(build_scheduler(llama_target, None, "0").generate(REQUESTS))
    s = build_scheduler(llama_target, llama_draft, stream={"block": 4})
    try:
        s.streamed.open(Silent())
        s.streamed.clock = lambda: 0.0  # no stall: the silent stream is never given up on
        runs = [s.submit(r) for r in REQUESTS]
        while s.has_work:
            s.step()
    finally:
        s.close()
    assert texts([r.result for r in runs]) == regular
    st = s.step_stats
    assert st.draft_tokens == 0 and 0 < st.stream_lookup_kept <= st.stream_looked_up, st
    assert st.committed_tokens > st.sequence_steps, "no step committed more than its target token"


def test_a_long_prompt_is_searched_over_its_last_window_of_tokens():
    from bass.core.config import LOOKUP_WINDOW

    ahead = DraftsAhead(lookup=2)
    old, recent = [7, 8, 9], [1] * LOOKUP_WINDOW
    ahead.follow(1, old + recent[:-1] + [7])
    assert ahead.lookup(1, (), 2) == ()  # the 7 -> 8 of long ago is outside the window
    ahead.commit(1, [8, 3, 7])
    assert ahead.lookup(1, (), 2) == (8, 3)  # what is committed after is searched
