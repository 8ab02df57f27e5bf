"""Incremental detokenization and exact stops: the same text as decoding everything at once,
at a cost per step that does not grow with the sequence."""

from __future__ import annotations

import random

import pytest

from bass.coordinator.incremental_text import IncrementalText
from bass.coordinator.requests import FinishReason
from bass.coordinator.stopping import StopCriteria, check_stop
from bass.coordinator.tokenizer import HFCodec
from tiny_models import save_tokenizer

SPM_PIECES = ["\u2581", "\u2581the", "\u2581hello", "\u2581world", "ll", "o", "he", "\u2581w", ".", ",", "'s",
              "\u2581(", ")", "\u2581\u00e9t\u00e9", "\u4e2d"]  # fmt: skip


def _spm_codec(tmp_path) -> HFCodec:
    """A Llama-style SentencePiece tokenizer: byte fallback, "▁" for spaces and a decoder that
    strips the first space of the text (so a token's text depends on whether it comes first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({p: 259 + i for i, p in enumerate(SPM_PIECES)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(tmp_path))
    return HFCodec(tmp_path)


def _byte_level_codec(tmp_path) -> HFCodec:
    save_tokenizer(tmp_path)
    return HFCodec(tmp_path)


@pytest.fixture(params=["byte-level", "sentencepiece"])
def codec(request, tmp_path):
    return _byte_level_codec(tmp_path) if request.param == "byte-level" else _spm_codec(tmp_path)


def _vocab_size(codec: HFCodec) -> int:
    return len(codec._tok)


def _feed_in_random_chunks(codec, ids, rng, where):
    """Feed `ids` a few at a time. The stable text only grows; whenever the pending part ends
    on a complete character, stable + pending is exactly the full decode (in the middle of a
    character, byte fallback shows the whole byte run as U+FFFD for a while); so is the text
    at the end."""
    text, taken, stable_before = IncrementalText(codec.decode), 0, ""
    while taken < len(ids):
        n = rng.randint(1, 9)
        text.extend(ids[taken:taken + n])
        taken = min(len(ids), taken + n)
        assert text.stable.startswith(stable_before), where
        if not text.pending().endswith("\ufffd"):
            assert text.stable + text.pending() == codec.decode(ids[:taken]), (where, ids[:taken])
        stable_before = text.stable
    assert text.stable + text.pending() == codec.decode(ids) == text.text(), (where, ids)


WORDS = ["the", "hello", "world", "x = 1", "naïve", "été", "日本語", "中", "→", "🙂", "(", ")", ".", ",", "'s", "\n"]


def test_text_equals_a_full_decode_however_the_tokens_arrive(codec):
    """Text with multi-byte characters (split over byte tokens by both tokenizers), fed in
    random chunks."""
    rng = random.Random(0)
    for trial in range(40):
        words = [rng.choice(WORDS) for _ in range(rng.randrange(1, 25))]
        _feed_in_random_chunks(codec, codec.encode(" ".join(words)), rng, trial)


def test_random_byte_level_streams_with_invalid_utf8(tmp_path):
    """Any token sequence, invalid UTF-8 and special tokens included (byte-level decoding
    replaces an invalid byte where it stands, so nothing stable is ever revised)."""
    codec, rng = _byte_level_codec(tmp_path), random.Random(1)
    for trial in range(40):
        ids = [rng.randrange(_vocab_size(codec)) for _ in range(rng.randrange(1, 60))]
        _feed_in_random_chunks(codec, ids, rng, trial)


def test_a_split_character_is_held_until_it_is_complete(tmp_path):
    codec = _spm_codec(tmp_path)
    lead, middle, last = (3 + b for b in "\u4e2d".encode())  # 中 as three byte-fallback tokens
    text = IncrementalText(codec.decode)
    text.extend([259 + SPM_PIECES.index("\u2581hello")])
    assert text.stable == "hello"
    for byte in (lead, middle):
        text.extend([byte])
        assert text.stable == "hello" and text.pending().endswith("\ufffd")
    text.extend([last])
    assert text.stable == "hello\u4e2d" and text.pending() == ""


def test_each_step_decodes_a_window_not_the_whole_output(tmp_path):
    codec = _byte_level_codec(tmp_path)
    decoded: list[int] = []

    def counting_decode(ids):
        decoded.append(len(ids))
        return codec.decode(ids)

    ids = codec.encode("def fibonacci(n):\n    return n\n" * 60)
    text, stops = IncrementalText(counting_decode), StopCriteria(frozenset(), ("\nclass",), 10_000)
    for start in range(0, len(ids), 5):
        step = ids[start:start + 5]
        decision = check_stop(start, text, step, stops)
        assert decision.reason is None
        text.extend(step)
    assert len(ids) >= 600 and max(decoded) <= 20  # a full decode per step would reach len(ids)
    assert text.stable == codec.decode(ids)


def _criteria(stops=(), stop_ids=(), max_new=1000) -> StopCriteria:
    return StopCriteria(frozenset(stop_ids), tuple(stops), max_new)


def test_stop_string_spanning_two_steps_cuts_at_its_start(tmp_path):
    codec = _byte_level_codec(tmp_path)
    first, second = codec.encode("return a"), codec.encode("\nclass B")
    text = IncrementalText(codec.decode)
    assert check_stop(0, text, first, _criteria(["\ncl"])).reason is None
    text.extend(first)
    assert text.stable == "return a"
    decision = check_stop(len(first), text, second, _criteria(["\ncl"]))
    assert decision.reason is FinishReason.STOP
    kept = second[:decision.keep]
    assert "\ncl" in codec.decode(first + kept) and "\ncl" not in codec.decode(first + kept[:-1])
    text.extend(decision.text_tokens(second))
    assert text.text()[:decision.text_end] == "return a"


def test_the_earliest_of_several_stops_wins_and_a_stop_id_has_no_text(tmp_path):
    codec = _byte_level_codec(tmp_path)
    eos = 0
    tokens = codec.encode("x = 1") + [eos] + codec.encode("print(x)")
    text = IncrementalText(codec.decode)
    decision = check_stop(0, text, tokens, _criteria(stops=["print"], stop_ids=[eos]))
    # the stop id comes first; the stop string after it is never reached
    assert decision.reason is FinishReason.STOP and decision.keep == len(codec.encode("x = 1")) + 1
    assert decision.ends_with_stop_id and decision.text_end is None
    text.extend(decision.text_tokens(tokens))
    assert text.text() == "x = 1"
    # max_new_tokens cuts before either
    decision = check_stop(0, IncrementalText(codec.decode), tokens, _criteria(["print"], [eos], max_new=2))
    assert (decision.keep, decision.reason) == (2, FinishReason.LENGTH)
