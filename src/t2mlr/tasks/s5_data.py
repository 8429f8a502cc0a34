"""S5-Retrieval samples as training rows for causal LMs, with the transduction alignment made explicit.

S5-Retrieval is a transduction: the target *at* position t must be predicted from the logits *at*
position t (the model has read inputs 0..t). Every model in this package (T²MLR, the matched
Transformer, the LSTM) follows the Hugging Face causal-LM convention instead: `forward(labels=…)`
scores logits[t] against labels[t+1]. We bridge the two by shifting the labels right by one
(labels_for_model[t+1] = target[t]); the trainer's `Collator` does that shift for datasets that set
`labels_aligned_to_inputs = True`, which this one does.

The shift needs one label slot past the last input, so each row gets one extra input token at the
end (`<eos>`) whose own target is ignored (-100). Without it the last target of every sequence would
silently drop out of the loss. The extra token cannot influence any earlier position (every model
here is causal), so predictions at positions 0..T-1 are exactly those on the bare input.

Only positions after the delimiter carry targets (`score_start`); the dictionary and the delimiter
are labelled -100, as in the evaluation (scoring the copied dictionary would inflate accuracy).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from t2mlr.tasks.jsonl import read_jsonl
from t2mlr.tasks.s5 import Perm, generating_set
from t2mlr.tasks.s5_retrieval import (
    generate_s5_retrieval,
    make_sample,
    validate_alphabet,
)
from t2mlr.tasks.tokenizers import IGNORE_INDEX, encode_s5_sample

__all__ = [
    "S5DataSpec",
    "S5RetrievalDataset",
    "StreamedS5Dataset",
    "encode_row",
    "s5_retrieval_dataset",
    "s5_stream_dataset",
]


def encode_row(tokenizer: PreTrainedTokenizerBase, sample: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """One training row: inputs + `<eos>`, aligned (unshifted) labels + -100; see the module docstring."""
    encoded = encode_s5_sample(tokenizer, sample)
    if tokenizer.eos_token_id is None:
        raise ValueError("the S5 tokenizer needs an <eos> token to terminate rows")
    input_ids = [*encoded["input_ids"], int(tokenizer.eos_token_id)]
    labels = [*encoded["labels"], IGNORE_INDEX]
    return {"input_ids": torch.tensor(input_ids, dtype=torch.long), "labels": torch.tensor(labels, dtype=torch.long)}


class S5RetrievalDataset(Dataset):
    """Map-style dataset of encoded S5-Retrieval rows, tokenized once up front (the data are small)."""

    labels_aligned_to_inputs = True  # read by the trainer's Collator: it shifts labels right by one

    def __init__(self, samples: Sequence[Mapping[str, Any]], tokenizer: PreTrainedTokenizerBase) -> None:
        if not samples:
            raise ValueError("S5RetrievalDataset needs at least one sample")
        self.rows = [encode_row(tokenizer, s) for s in samples]
        self.n = [int(s["n"]) for s in samples]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def s5_retrieval_dataset(path: str, tokenizer: str) -> S5RetrievalDataset:
    """Trainer factory (`data.factory: t2mlr.tasks.s5_data:s5_retrieval_dataset`).

    `path` is a jsonl file written by `t2mlr data s5-retrieval`; `tokenizer` its tokenizer directory.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"S5-Retrieval data file not found: {path}")
    return S5RetrievalDataset(read_jsonl(path), AutoTokenizer.from_pretrained(tokenizer))


@dataclass(frozen=True)
class S5DataSpec:
    """How samples are drawn; sample i of a stream is a pure function of (spec, stream, i).

    `num_actions=None` draws actions from all of S5 with the tasks package's generator (the paper's
    task); an int draws them from a seeded generating set of that size (`t2mlr.tasks.s5.generating_set`).
    """

    k: int
    dict_size: int
    alphabet: str
    num_actions: int | None = None
    seed: int = 0

    def action_set(self) -> tuple[Perm, ...] | None:
        return None if self.num_actions is None else _generating_set(self.num_actions, self.seed)

    def sample(self, n_range: tuple[int, int], stream: str, index: int) -> dict[str, Any]:
        """Sample `index` of `stream` (e.g. "train", "eval-n7"), N uniform in `n_range`."""
        if self.num_actions is None:
            return generate_s5_retrieval(
                1, n_range, self.k, self.dict_size, self.seed, self.alphabet, stream=f"{stream}-{index}"
            )[0]
        rng = random.Random(f"t2mlr/s5-restricted/{stream}/{self.seed}/{index}")
        n = rng.randint(*n_range)
        return make_sample(rng, n, self.k, self.dict_size, validate_alphabet(self.alphabet), self.action_set())


# `generating_set`, computed once per (size, seed): it is a pure function of them, and checking that a candidate set
# generates S5 took four fifths of the time of drawing a training row.
_generating_set = functools.cache(generating_set)


class StreamedS5Dataset(Dataset):
    """`size` training rows generated on demand (deterministic per index), so long runs see fresh data
    without storing it: the paper preset draws ~10M sequences of ~840 tokens."""

    labels_aligned_to_inputs = True  # see the module docstring

    def __init__(self, spec: S5DataSpec, n_range: tuple[int, int], size: int,
                 tokenizer: PreTrainedTokenizerBase, stream: str = "train") -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if spec.dict_size < n_range[1]:
            raise ValueError(f"dict_size={spec.dict_size} must be >= the largest N={n_range[1]}")
        self.spec, self.n_range, self.size, self.tokenizer, self.stream = spec, n_range, size, tokenizer, stream
        spec.action_set()  # fail now, not inside a DataLoader worker

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return encode_row(self.tokenizer, self.spec.sample(self.n_range, self.stream, index))


def s5_stream_dataset(
    tokenizer: str, k: int, dict_size: int, alphabet: str, n_lo: int, n_hi: int, size: int,
    num_actions: int | None = None, seed: int = 0,
) -> StreamedS5Dataset:
    """Trainer factory (`data.factory: t2mlr.tasks.s5_data:s5_stream_dataset`), plain-value kwargs."""
    spec = S5DataSpec(k=k, dict_size=dict_size, alphabet=alphabet, num_actions=num_actions, seed=seed)
    return StreamedS5Dataset(spec, (n_lo, n_hi), size, AutoTokenizer.from_pretrained(tokenizer))
