"""The device lookup after the draft's tokens (engine/lookup_tail.py) against a plain scan."""

import random

import pytest
import torch

from bass.engine.lookup_tail import PAD, lookup_tail, stage_text


def scan(text: list[int], drafts: list[int], m: int, longest: int = 3) -> list[int]:
    """The rule, written as a loop: the longest recurring suffix's most recent earlier
    occurrence (one with a token after it), and the m tokens after it; the last token where
    none recurs or the text ends."""
    s = text + drafts
    for n in range(min(longest, len(s) - 1), 0, -1):
        suffix = s[-n:]
        for end in range(len(s) - 1, n - 1, -1):
            if s[end - n:end] == suffix:
                after = s[end:end + m]
                return after + [s[-1]] * (m - len(after))
    return [s[-1]] * m


def run(texts, drafts, m, window=16):
    staged = stage_text(texts, window)
    return lookup_tail(staged, torch.tensor(drafts, dtype=torch.int64).view(len(texts), -1), m).tolist()


def test_it_continues_from_the_latest_occurrence_of_the_longest_suffix():
    # "7 8" recurs twice: the latest occurrence is followed by 1 2; "9 7 8" once, followed by 5 6.
    text = [9, 7, 8, 5, 6, 3, 7, 8, 1, 2, 4, 9]
    assert run([text], [[7, 8]], 2) == [[5, 6]]  # the 3-gram 9 7 8 wins over the more recent 7 8
    assert run([text], [[3, 7]], 3) == [[8, 1, 2]]


def test_a_match_may_run_into_the_drafts_and_past_the_end():
    text = [1, 2, 3, 4]
    # s = 1 2 3 4 1 2: "1 2" occurs at the start, followed by 3 4 1 2 (the last two are drafts).
    assert run([text], [[1, 2]], 4) == [[3, 4, 1, 2]]
    # s = 5 6 5: "5" occurs first followed by 6 5, then the text ends: the rest is the last token.
    assert run([[5, 6]], [[5]], 4) == [[6, 5, 5, 5]]


def test_no_occurrence_repeats_the_last_token_and_padding_never_matches():
    assert run([[1, 2, 3]], [[4]], 2) == [[4, 4]]
    # A short text is padded with PAD on the left; a suffix reaching into it is not looked up.
    staged = stage_text([[5]], 4)
    assert staged.tolist() == [[PAD, PAD, PAD, 5]]
    assert lookup_tail(staged, torch.zeros(1, 0, dtype=torch.int64), 2).tolist() == [[5, 5]]


def test_without_drafts_it_looks_up_the_texts_own_end():
    assert run([[4, 5, 6, 4, 5]], [[]], 2) == [[6, 4]]


@pytest.mark.parametrize("seed", range(6))
def test_random_rows_agree_with_the_scan(seed):
    rng = random.Random(seed)
    window, k, m = 24, rng.choice([0, 1, 3, 4]), rng.choice([1, 2, 3, 6])
    texts = [[rng.randrange(5) for _ in range(rng.randrange(1, 40))] for _ in range(7)]
    drafts = [[rng.randrange(5) for _ in range(k)] for _ in texts]
    got = run(texts, drafts, m, window)
    assert got == [scan(t[-window:], d, m) for t, d in zip(texts, drafts)]


@pytest.mark.parametrize("seed", range(4))
def test_the_triton_kernel_agrees_with_the_reference(seed):
    """kernels/triton_lookup.py (Triton's interpreter on the CPU, compiled on a GPU) against
    the tensor-op reference, with drafts and without, texts shorter than the window included."""
    from bass.kernels.triton_lookup import lookup_tail as kernel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = random.Random(100 + seed)
    window, k, m = 32, [0, 1, 3, 5][seed], [1, 2, 6, 3][seed]
    texts = [[rng.randrange(6) for _ in range(rng.randrange(1, 50))] for _ in range(9)]
    staged = stage_text(texts, window).to(device)
    drafts = torch.tensor([[rng.randrange(6) for _ in range(k)] for _ in texts], dtype=torch.int64,
                          device=device).view(len(texts), k)
    assert kernel(staged, drafts, m).tolist() == lookup_tail(staged, drafts, m).tolist()
