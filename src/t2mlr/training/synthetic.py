"""`SyntheticChainDataset`: the built-in synthetic data (`data.source: synthetic`), no files, no network.

Its own module so that the config can check `data.kwargs` against its signature without importing the
data pipeline (`t2mlr.training.data` imports the config)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from t2mlr.model.layout import positions_within_documents
from t2mlr.tasks.tokenizers import numbered_tokenizer
from t2mlr.utils import IGNORE_INDEX

__all__ = ["SYNTHETIC_DEFAULTS", "SyntheticChainDataset"]

SYNTHETIC_DEFAULTS = {"num_samples": 4096, "vocab_size": 64}


class SyntheticChainDataset(Dataset):
    """Packed rows of documents that follow a fixed random successor table over the vocabulary.

    Each document starts at a random token and continues with next = succ[current] (with
    probability `noise` a random token instead). The table depends only on `rule_seed`, so training
    and evaluation sets (different `seed`) share the rule; each row depends only on (seed, index).
    A small model learns the table quickly: the loss falls from ln(vocab) towards the noise floor.
    """

    def __init__(
        self, num_samples: int, seq_len: int, vocab_size: int, seed: int = 0, rule_seed: int = 0,
        min_doc_len: int = 4, max_doc_len: int = 32, noise: float = 0.0,
    ) -> None:
        if vocab_size < 2 or not 1 <= min_doc_len <= max_doc_len:
            raise ValueError("need vocab_size >= 2 and 1 <= min_doc_len <= max_doc_len")
        self.num_samples = num_samples
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self.min_doc_len, self.max_doc_len, self.noise = min_doc_len, max_doc_len, noise
        self.successor = np.random.default_rng(rule_seed).permutation(vocab_size)

    @property
    def tokenizer(self) -> Any:
        """Words `t0 .. t{V-1}` for the token ids (`t2mlr.tasks.tokenizers.numbered_tokenizer`): saved with
        the run's checkpoints, so they load in `t2mlr generate`."""
        return numbered_tokenizer(self.vocab_size)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        rng = np.random.default_rng([self.seed, index])
        tokens = np.empty(self.seq_len, dtype=np.int64)
        starts = np.zeros(self.seq_len, dtype=bool)
        pos = 0
        while pos < self.seq_len:
            length = min(int(rng.integers(self.min_doc_len, self.max_doc_len + 1)), self.seq_len - pos)
            starts[pos] = True
            tokens[pos] = rng.integers(self.vocab_size)
            for t in range(pos + 1, pos + length):
                noisy = self.noise > 0 and rng.random() < self.noise
                tokens[t] = rng.integers(self.vocab_size) if noisy else self.successor[tokens[t - 1]]
            pos += length
        ids = torch.from_numpy(tokens)
        start_mask = torch.from_numpy(starts)
        labels = ids.masked_fill(start_mask, IGNORE_INDEX)
        return {"input_ids": ids, "position_ids": positions_within_documents(start_mask), "labels": labels}
