"""Word-level tokenizers (one token per task symbol) as ``transformers`` fast tokenizers.

Each tokenizer is a ``tokenizers.Tokenizer`` with a ``WordLevel`` model, wrapped in
``transformers.PreTrainedTokenizerFast`` so it saves/loads with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` and works with ``generate()`` (pad/bos/eos ids are set).

Splitting text into symbols:

* default (``split_pattern=None``): greedy longest match against the vocabulary, scanning left
  to right; a character that starts no vocabulary symbol becomes one ``<unk>``; whitespace that
  is not itself a vocabulary symbol is dropped. For S5 this turns
  ``"<A_32514>F4Nd|<A_54213>____"`` into ``<A_32514> F 4 N d | <A_54213> _ _ _ _``.
* with ``split_pattern``: the regex's matches are the symbols (everything else is dropped).

The decoder concatenates the symbols with nothing in between, so ``decode(encode(s)) == s``
for any string made of vocabulary symbols (the canonical form of a sample).

Vocabulary ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then the task symbols in the
order given. No BOS/EOS is added automatically.

Label alignment for S5-Retrieval (``encode_s5_sample``): it is a transduction task, so
``labels[t]`` is the target symbol *at position t* and must be predicted from the logits *at
position t* (the model has seen inputs 0..t). Labels are therefore NOT shifted: a loss must
compare ``logits[:, t]`` with ``labels[:, t]`` directly. Do not pass these labels to a Hugging
Face causal-LM ``forward(labels=...)``, which shifts labels by one internally. Positions outside
the scored part (the dictionary and the delimiter) have label -100.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from t2mlr.tasks.prosqa import CONSONANTS, VOWELS
from t2mlr.tasks.s5 import ALL_TOKENS
from t2mlr.tasks.s5_retrieval import (
    BLANK,
    DEFAULT_ALPHABET,
    DELIMITER,
    validate_alphabet,
)
from t2mlr.utils import IGNORE_INDEX

__all__ = [
    "BOS",
    "EOS",
    "IGNORE_INDEX",
    "PAD",
    "SPECIAL_TOKENS",
    "UNK",
    "WORD_PATTERN",
    "build_s5_tokenizer",
    "build_task_tokenizer",
    "build_word_tokenizer",
    "numbered_tokenizer",
    "encode_s5_sample",
    "word_vocab_from_texts",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
# Angle-bracket symbols, ASCII words, single whitespace characters, single punctuation marks.
# Written with explicit ASCII classes so Python's ``re`` and Oniguruma agree on it.
WORD_PATTERN = r"<[^<>\s]+>|[A-Za-z0-9_]+|\s|[^A-Za-z0-9_\s]"


def _onig_escape(symbol: str) -> str:
    """Escape a literal for Oniguruma: alphanumerics as is, everything else as ``\\x{HEX}``."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in symbol)


def _longest_match_pattern(symbols: Sequence[str]) -> str:
    """Alternation tried longest first (Oniguruma takes the first alternative that matches)."""
    ordered = sorted(symbols, key=len, reverse=True)
    return "|".join(_onig_escape(s) for s in ordered) + r"|\S"


def _checked_vocab(vocab_tokens: Iterable[str]) -> list[str]:
    """Task symbols in first-seen order; specials and empty strings are rejected."""
    symbols = list(dict.fromkeys(vocab_tokens))
    if not symbols:
        raise ValueError("vocab_tokens is empty")
    for s in symbols:
        if not isinstance(s, str) or not s:
            raise ValueError(f"vocabulary symbols must be non-empty strings, got {s!r}")
        if s in SPECIAL_TOKENS:
            raise ValueError(f"{s!r} is a reserved special token; do not list it in vocab_tokens")
    return symbols


def build_word_tokenizer(vocab_tokens: Iterable[str], split_pattern: str | None = None) -> PreTrainedTokenizerFast:
    """A fast word-level tokenizer whose vocabulary is the specials plus ``vocab_tokens``."""
    symbols = _checked_vocab(vocab_tokens)
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *symbols])}
    pattern = _longest_match_pattern(symbols) if split_pattern is None else split_pattern
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )


def numbered_tokenizer(
    vocab_size: int, pad_token_id: int = 0, prefix: str = "t", bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> PreTrainedTokenizerFast:
    """Words `t0 t1 ... t{V-1}` for token ids 0..V-1, and nothing else: a tokenizer for data that is
    token ids only (the trainer's synthetic data), so its runs save a tokenizer that `t2mlr generate`,
    `t2mlr eval` and stock lm-eval can use (`t2mlr generate runs/debug/final --prompt "t3 t17"`). The
    padding token is the data's padding id; unknown words map to it too.

    BOS and EOS are words of the vocabulary too (tools such as lm-eval's HFLM need both: BOS or EOS
    prefixes an empty context, EOS ends a generation). By default they are `t1` and `t2`, the ids
    transformers' Llama config gives BOS and EOS, which a preset's model config inherits, so the tokenizer
    and `generate()` stop at the same token; the padding id when the vocabulary is smaller. Nothing adds
    them to encoded text."""
    if vocab_size < 1 or not 0 <= pad_token_id < vocab_size:
        raise ValueError(f"need vocab_size >= 1 and 0 <= pad_token_id < vocab_size, got {vocab_size}, {pad_token_id}")
    bos_token_id = _special_id(bos_token_id, 1, pad_token_id, vocab_size, "bos_token_id")
    eos_token_id = _special_id(eos_token_id, 2, pad_token_id, vocab_size, "eos_token_id")
    vocab = {f"{prefix}{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=f"{prefix}{pad_token_id}"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    def word(i: int) -> AddedToken:  # whole words only: `t1` must not match inside `t17`
        return AddedToken(f"{prefix}{i}", single_word=True, special=True)

    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=word(pad_token_id), unk_token=word(pad_token_id),
        bos_token=word(bos_token_id), eos_token=word(eos_token_id),
    )


def _special_id(given: int | None, default: int, pad_token_id: int, vocab_size: int, name: str) -> int:
    """A special token's id: the one given (checked), else `default` if the vocabulary has it, else the pad id."""
    if given is None:
        return default if default < vocab_size else pad_token_id
    if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < vocab_size:
        raise ValueError(f"{name} must be an id in [0, {vocab_size}), got {given!r}")
    return given


def word_vocab_from_texts(texts: Iterable[str], pattern: str = WORD_PATTERN) -> list[str]:
    """Distinct symbols of ``texts`` under ``pattern``, sorted, for ``build_word_tokenizer``."""
    regex = re.compile(pattern)
    found = {symbol for text in texts for symbol in regex.findall(text)}
    return sorted(found - set(SPECIAL_TOKENS))


def build_s5_tokenizer(k: int = 4, alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """Vocabulary: specials, ``|``, the blank ``_``, the alphabet, then the 120 ``<A_…>`` tokens.

    The vocabulary does not depend on ``k``; it is validated so a bad config fails here too.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    validate_alphabet(alphabet)
    return build_word_tokenizer([DELIMITER, BLANK, *alphabet, *ALL_TOKENS])


def _ids_of(tokenizer: PreTrainedTokenizerFast, tokens: Sequence[str], what: str) -> list[int]:
    """Map symbols to ids, refusing symbols the tokenizer does not know."""
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    unk = tokenizer.unk_token_id
    unknown = sorted({t for t, i in zip(tokens, ids) if i is None or (i == unk and t != UNK)})
    if unknown:
        raise ValueError(f"{what} has symbols missing from the tokenizer vocabulary: {unknown[:10]}")
    return ids


def encode_s5_sample(tokenizer: PreTrainedTokenizerFast, sample: Mapping[str, Any]) -> dict[str, list[int]]:
    """``input_ids``, aligned (unshifted) ``labels`` and ``attention_mask`` for one sample.

    ``labels[t]`` = id of ``target_tokens[t]`` for ``t >= score_start``, else -100; see the
    module docstring for why the labels are not shifted.
    """
    inputs, targets = sample["input_tokens"], sample["target_tokens"]
    if len(inputs) != len(targets):
        raise ValueError(f"input and target lengths differ: {len(inputs)} vs {len(targets)}")
    score_start = int(sample["score_start"])
    if not (0 < score_start <= len(inputs)):
        raise ValueError(f"score_start={score_start} outside 1..{len(inputs)}")
    input_ids = _ids_of(tokenizer, inputs, "input_tokens")
    target_ids = _ids_of(tokenizer, targets, "target_tokens")
    labels = [IGNORE_INDEX] * score_start + target_ids[score_start:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def build_task_tokenizer(texts: Iterable[str], phrases: Sequence[str] = (), syllables: bool = False,
                         max_words: int = 4000) -> PreTrainedTokenizerFast:
    """A word-level tokenizer for a from-scratch finetune: the task's phrases, the words of the training texts,
    ProsQA's consonant-vowel syllables (`syllables`) and every single character of the texts, matched longest
    first, so that ``decode(encode(text)) == text`` for any text made of those characters.

    `max_words` keeps the most frequent training words only (rare words fall back to characters)."""
    texts = list(texts)
    counts = Counter(word for text in texts for word in word_vocab_from_texts([text]) if len(word) > 1)
    words = sorted(counts, key=lambda w: (-counts[w], w))[:max_words]
    characters = sorted({c for text in texts for c in text})
    pairs = [c + v for c, v in itertools.product(CONSONANTS, VOWELS)] if syllables else []
    symbols = [s for s in dict.fromkeys([*phrases, *pairs, *sorted(words), *characters]) if s not in SPECIAL_TOKENS]
    if syllables:  # ProsQA's names are syllable sequences: whole words would not cover the held-out names
        symbols = [s for s in symbols if s in phrases or s in pairs or len(s) == 1 or not s.islower()]
    return build_word_tokenizer(symbols)
