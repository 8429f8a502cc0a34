"""Supervised-finetuning rows for the reasoning finetunes: prompt masked from the loss, target supervised.

A row is ``[BOS] prompt target [EOS]``, the prompt masked from the loss (`t2mlr.tasks.sft`). With
``prompt_recurrence_mask`` the row also carries ``recurrence_mask``, so T²MLR fuses its recurrent state
only into target tokens, which is how the authors' release finetunes. The trainer drops the mask for
architectures without recurrence.

Also builds the word-level tokenizer of a from-scratch run: the task's phrases, the words of the training
texts, ProsQA's consonant-vowel syllables and every single character of the texts, matched longest first,
so that ``decode(encode(text)) == text`` for any text made of those characters.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from t2mlr.tasks.jsonl import read_jsonl
from t2mlr.tasks.sft import sft_row
from t2mlr.tasks.tokenizers import (
    SPECIAL_TOKENS,
    build_word_tokenizer,
    word_vocab_from_texts,
)
from t2mlr.utils import load_tokenizer

__all__ = ["SFTDataset", "build_task_tokenizer", "encode_sft", "sft_dataset"]

_CONSONANTS, _VOWELS = "bcdfglmnprstvz", "aeiou"


def encode_sft(tokenizer: PreTrainedTokenizerBase, prompt: str, target: str,
               prompt_recurrence_mask: bool = False) -> dict[str, torch.Tensor]:
    """One training row: BOS, prompt (masked from the loss), target, EOS (`t2mlr.tasks.sft.sft_row`)."""
    return sft_row(tokenizer, prompt, target, bos=True, recurrence_mask=prompt_recurrence_mask)


class SFTDataset(Dataset):
    """Encoded SFT rows of a JSON-lines file of ``{prompt, target}`` records (encoded once, up front)."""

    def __init__(self, records: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase,
                 prompt_recurrence_mask: bool = False) -> None:
        self.tokenizer = tokenizer  # saved with every checkpoint by the trainer
        self.rows = [encode_sft(tokenizer, r["prompt"], r["target"], prompt_recurrence_mask) for r in records]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def sft_dataset(path: str, tokenizer: str, prompt_recurrence_mask: bool = False) -> SFTDataset:
    """The trainer's data factory (`data.factory: t2mlr.experiments.finetune_data:sft_dataset`)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"SFT data file not found: {path}")
    return SFTDataset(read_jsonl(path), load_tokenizer(tokenizer), prompt_recurrence_mask)


def build_task_tokenizer(texts: Iterable[str], phrases: Sequence[str] = (), syllables: bool = False,
                         max_words: int = 4000) -> PreTrainedTokenizerBase:
    """A word-level tokenizer for a from-scratch run (see the module docstring).

    `max_words` keeps the most frequent training words only (rare words fall back to characters)."""
    texts = list(texts)
    counts: dict[str, int] = {}
    for text in texts:
        for word in word_vocab_from_texts([text]):
            if len(word) > 1:
                counts[word] = counts.get(word, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[:max_words]
    characters = sorted({c for text in texts for c in text})
    pairs = [c + v for c, v in itertools.product(_CONSONANTS, _VOWELS)] if syllables else []
    symbols = [s for s in dict.fromkeys([*phrases, *pairs, *sorted(words), *characters]) if s not in SPECIAL_TOKENS]
    if syllables:  # ProsQA's names are syllable sequences: whole words would not cover the held-out names
        symbols = [s for s in symbols if s in phrases or s in pairs or len(s) == 1 or not s.islower()]
    return build_word_tokenizer(symbols)
