"""tokenizer.json and tokenizer_config.json rebuilt from a GGUF's tokenizer metadata.

A GGUF carries the vocabulary, merges, token kinds and special ids, but not the text pipeline
around them: llama.cpp keys that on `tokenizer.ggml.pre` (a name) and hard-codes the split
regex per name. We do the same, for the names our architectures use; an unknown name is an
error, because guessing a pre-tokenizer gives a tokenizer that runs but silently splits text
differently from the one the model was trained with.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .errors import GGUFConversionError
from .gguf_metadata import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    GGUFMetadata,
)

# Split regexes by `tokenizer.ggml.pre`; these are the public regexes the models were trained with.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_SPLIT = None  # ByteLevel's built-in regex is GPT-2's
_PRE_TOKENIZERS = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "default": _GPT2_SPLIT,
    "gpt-2": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
}
# Qwen2's reference tokenizer NFC-normalizes input; llama.cpp skips that, HF does not. We follow
# the HF reference since the rest of BASS runs on transformers.
_NFC_PRE = frozenset({"qwen2", "deepseek-r1-qwen"})

_SPM_SPACE = "\u2581"  # sentencepiece's visible space


def build_tokenizer_files(meta: GGUFMetadata) -> tuple[str, dict[str, Any]]:
    """Return (tokenizer.json text, tokenizer_config dict)."""
    kind = meta.require("tokenizer.ggml.model")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta)
    else:
        raise GGUFConversionError(f"tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    _set_post_processor(tokenizer, meta, byte_level=kind == "gpt2")
    tokenizer_json = _with_added_tokens(tokenizer, meta)
    return tokenizer_json, _tokenizer_config(meta, kind)


def _byte_level_bpe(meta: GGUFMetadata) -> Tokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFConversionError(
            f"pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    # Only ordinary tokens belong to the BPE model: special tokens are matched before BPE runs
    # (added tokens), and UNUSED ones are llama.cpp padding ("[PAD151665]") that rounds the
    # vocabulary up to the embedding size; the reference tokenizer does not have them.
    vocab = {
        text: i
        for i, (text, kind) in enumerate(zip(meta.tokens, meta.token_types))
        if kind in (TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_BYTE)
    }
    merges = _file_merges(meta)
    if merges is None:
        raise GGUFConversionError("byte-level BPE tokenizer without tokenizer.ggml.merges")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    split = _PRE_TOKENIZERS[pre]
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in _NFC_PRE:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tokenizer


def _sentencepiece_bpe(meta: GGUFMetadata) -> Tokenizer:
    """llama.cpp's "llama" tokenizer: sentencepiece BPE with byte fallback (<0x..> tokens)."""
    tokens, kinds = meta.tokens, meta.token_types
    vocab = {text: i for i, text in enumerate(tokens)}
    merges = _file_merges(meta)
    if merges is None:
        merges = _merges_from_scores(tokens, kinds, meta.get("tokenizer.ggml.scores"))
    unk = meta.token_text("unknown_token_id")
    if unk is None:
        unk = next((t for t, k in zip(tokens, kinds) if k == TOKEN_UNKNOWN), None)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # Sentencepiece writes spaces as "▁" and, by default, starts the text with one.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_SPM_SPACE, prepend_scheme="first" if prefix_space else "never", split=False
    )
    steps = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix_space:
        steps.append(decoders.Strip(" ", 1, 0))  # drop the space the encoder prepended
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _file_merges(meta: GGUFMetadata) -> list[tuple[str, str]] | None:
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        return None
    pairs = []
    for line in merges:
        left, sep, right = line.partition(" ")
        if not sep:
            raise GGUFConversionError(f"malformed merge {line!r}")
        pairs.append((left, right))
    return pairs


def _merges_from_scores(tokens: list[str], kinds: list[int], scores: list[float] | None) -> list[tuple[str, str]]:
    """Sentencepiece-BPE merges implied by the vocabulary when the file stores none.

    Sentencepiece merges the adjacent pair whose concatenation has the best score; as a static
    BPE merge list that is: every split (a, b) of an ordinary piece a+b with both halves in the
    vocabulary, ordered by the merged piece's score (best first).
    """
    if scores is None:
        raise GGUFConversionError("sentencepiece tokenizer has neither merges nor scores")
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, kind, score in zip(tokens, kinds, scores):
        # Control/byte/unused pieces are never produced by merging text.
        if kind not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-score, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _set_post_processor(tokenizer: Tokenizer, meta: GGUFMetadata, byte_level: bool) -> None:
    # Byte-level post-processing only adjusts offsets; flags as in the reference Qwen2 tokenizer.
    steps = [processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)] if byte_level else []
    template = _bos_eos_template(meta)
    if template is not None:
        steps.append(template)
    if len(steps) == 1:
        tokenizer.post_processor = steps[0]
    elif steps:
        tokenizer.post_processor = processors.Sequence(steps)


def _bos_eos_template(meta: GGUFMetadata) -> processors.TemplateProcessing | None:
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", meta.require("tokenizer.ggml.model") == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = meta.token_text("bos_token_id"), meta.token_text("eos_token_id")
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    if not (add_bos or add_eos):
        return None
    head = [f"{bos}:0"] if add_bos else []
    tail = [f"{eos}:0"] if add_eos else []
    specials = []
    if add_bos:
        specials.append((bos, meta.get("tokenizer.ggml.bos_token_id")))
    if add_eos and eos != bos:
        specials.append((eos, meta.get("tokenizer.ggml.eos_token_id")))
    single = " ".join(head + ["$A:0"] + tail)
    pair_b = [t.replace(":0", ":1") for t in head] + ["$B:1"] + [t.replace(":0", ":1") for t in tail]
    return processors.TemplateProcessing(single=single, pair=single + " " + " ".join(pair_b), special_tokens=specials)


def _with_added_tokens(tokenizer: Tokenizer, meta: GGUFMetadata) -> str:
    """Serialize, listing control and user-defined tokens as added tokens at their GGUF ids.

    The Python API would number added tokens itself; writing them into the JSON pins each one
    to the id the model's embedding expects.
    """
    data = json.loads(tokenizer.to_str())
    added = []
    for i, (text, kind) in enumerate(zip(meta.tokens, meta.token_types)):
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            added.append(
                {
                    "id": i,
                    "content": text,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": kind != TOKEN_USER_DEFINED,
                }
            )
    data["added_tokens"] = added
    text = json.dumps(data, ensure_ascii=False)
    _check_ids(Tokenizer.from_str(text), added)
    return text


def _check_ids(tokenizer: Tokenizer, added: list[dict[str, Any]]) -> None:
    for entry in added:
        if tokenizer.token_to_id(entry["content"]) != entry["id"]:
            raise GGUFConversionError(f"added token {entry['content']!r} did not keep id {entry['id']}")


def _tokenizer_config(meta: GGUFMetadata, kind: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        # The generic fast class loads tokenizer.json as-is in transformers 4 and 5; a
        # model-specific class may rebuild parts of the pipeline from its own defaults.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": meta.token_text("bos_token_id"),
        "eos_token": meta.token_text("eos_token_id"),
        "unk_token": meta.token_text("unknown_token_id"),
        "pad_token": meta.token_text("padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": int(meta.arch_get("context_length", 2048)),
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config
