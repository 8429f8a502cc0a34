"""Training rows straight from token shards: a map-style torch Dataset over memory-mapped files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from t2mlr.corpus.errors import CorpusError
from t2mlr.corpus.shards import read_manifest
from t2mlr.model.layout import positions_within_documents
from t2mlr.utils import IGNORE_INDEX


class ShardedTokenDataset(Dataset):
    """The shards of a tokenized corpus as one token stream cut into rows of `seq_len` tokens.

    Items are the trainer's packed-row format: ``input_ids``, ``position_ids`` restarting at 0 at
    every document start and at every row start (a document cut by a row boundary goes on as a new
    document in the next row), and ``labels`` equal to the ids except -100 at document starts. Rows
    run across shard boundaries (row i is tokens [i·seq_len, (i+1)·seq_len) of the concatenated
    shards); a trailing partial row is dropped. Document starts come from the shards' offset index,
    not from EOS tokens, so a text that happens to contain the EOS string does not split.

    Nothing is loaded up front: each process maps a shard's files on first use (the memory maps are
    not pickled, so DataLoader workers open their own).
    """

    def __init__(self, directory: str | os.PathLike[str], seq_len: int) -> None:
        if seq_len < 1:
            raise CorpusError(f"seq_len must be >= 1, got {seq_len}")
        self.directory = Path(directory)
        self.manifest: dict[str, Any] = read_manifest(self.directory)
        if not self.manifest["complete"]:
            raise CorpusError(f"{self.directory}: the tokenization is not complete; run tokenize_corpus again to "
                              f"finish it")
        self.seq_len = seq_len
        self.dtype = np.dtype(self.manifest["dtype"])
        self.eos_token_id: int = self.manifest["tokenizer"]["eos_token_id"]
        shards = self.manifest["shards"]
        self._token_files = [self.directory / shard["tokens"] for shard in shards]
        self._offset_files = [self.directory / shard["offsets"] for shard in shards]
        counts = np.array([shard["num_tokens"] for shard in shards], dtype=np.int64)
        self._shard_starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_tokens = int(self._shard_starts[-1])
        self.num_documents: int = self.manifest["num_documents"]
        self._maps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if len(self) == 0:
            raise CorpusError(f"{self.directory}: only {self.num_tokens} tokens, fewer than one row of {seq_len}")

    def __len__(self) -> int:
        return self.num_tokens // self.seq_len

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = {}
        return state

    def _shard(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, document offsets) of shard `index`, memory-mapped on first use."""
        if index not in self._maps:
            expected = int(self._shard_starts[index + 1] - self._shard_starts[index])
            tokens = np.memmap(self._token_files[index], dtype=self.dtype, mode="r", shape=(expected,))
            offsets = np.load(self._offset_files[index], mmap_mode="r")
            self._maps[index] = (tokens, offsets)
        return self._maps[index]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        row_start = index * self.seq_len
        lo, hi = row_start, row_start + self.seq_len
        ids = np.empty(self.seq_len, dtype=np.int64)
        starts = np.zeros(self.seq_len, dtype=bool)
        shard = int(np.searchsorted(self._shard_starts, lo, side="right")) - 1
        while lo < hi:  # the row's piece of each shard it overlaps
            base = int(self._shard_starts[shard])
            stop = min(hi, int(self._shard_starts[shard + 1]))
            tokens, offsets = self._shard(shard)
            ids[lo - row_start: stop - row_start] = tokens[lo - base: stop - base]
            first, last = np.searchsorted(offsets, [lo - base, stop - base], side="left")
            starts[np.asarray(offsets[first:last]) + (base - row_start)] = True
            lo = stop
            shard += 1
        ids, starts = torch.from_numpy(ids), torch.from_numpy(starts)
        starts[0] = True
        return {"input_ids": ids, "position_ids": positions_within_documents(starts),
                "labels": ids.masked_fill(starts, IGNORE_INDEX)}
