"""Training data: packed token sequences, a generic dataset interface, a collator and a resumable sampler.

The dataset interface is deliberately small so task packages plug in without depending on the
trainer: any map-style `torch.utils.data.Dataset` whose items are dicts of 1-D tensors

    {"input_ids": LongTensor[T], "labels": LongTensor[T] (optional), "position_ids": LongTensor[T] (optional),
     "recurrence_mask": BoolTensor[T] (optional)}

- `labels` are standard causal-LM labels (the model shifts them: logits at t are scored against
  labels[t+1]; -100 is ignored). Missing labels mean "predict every next token except across a
  document start".
- `position_ids` restarting at 0 mark document starts inside a packed row (docs/semantics.md §4): the model resets
  the recurrent cache there and keeps attention inside the document.
- Transduction tasks (input and target aligned token for token: the target *for* position t sits at
  t) set `labels_aligned_to_inputs = True` on the dataset (or in the data config). The collator then
  shifts such labels right by one, so that after the model's own shift the logits at t are scored
  against the aligned target at t.

Bad data fail before any training step, with a `DataError` (a ValueError) that names the file, the
1-based line and the field: a missing or empty file, invalid JSON, a line with neither the ids nor the
text field, ids that are not integers, a text line without a tokenizer. Given the model's vocabulary
size (read from its config before the model is built), `build_dataset` also checks every token id
against [0, vocab_size): jsonl lines as they are read, token shards in one chunked scan, datasets
that make rows on demand on a sample of rows (`check_token_range`).

Sampling is a pure function of (seed, step): the position in the data stream is just the number of
optimizer steps taken, which is what a checkpoint stores, and every rank of a torchrun job derives
its own share of each global batch from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm.auto import tqdm

from t2mlr.corpus.dataset import ShardedTokenDataset
from t2mlr.corpus.errors import CorpusError
from t2mlr.model.layout import positions_within_documents
from t2mlr.training.config import DataConfig, dataset_callable, dataset_kwargs
from t2mlr.training.data_files import DataError, existing_data_file, json_object
from t2mlr.utils import (
    IGNORE_INDEX,
    TokenizerNotFoundError,
    load_tokenizer,
    off_main_rank,
)

# ---------------------------------------------------------------------------------------------
# Data errors


def _out_of_range(ids: np.ndarray, vocab_size: int | None) -> int | None:
    """Index of the first id outside [0, vocab_size) (outside [0, ∞) without a vocabulary size), or None."""
    bad = ids < 0 if vocab_size is None else (ids < 0) | (ids >= vocab_size)
    if not bad.any():
        return None
    return int(np.argmax(bad))


def _allowed(vocab_size: int | None) -> str:
    return "token ids must be >= 0" if vocab_size is None else f"the allowed range is [0, {vocab_size})"


# ---------------------------------------------------------------------------------------------
# Packing


class PackedTokenDataset(Dataset):
    """Documents concatenated into one token stream and cut into rows of `seq_len` tokens.

    Positions restart at 0 at every document start and at every row start: a document cut by a row
    boundary continues as a new document in the next row, because R_0 = 0 at the start of every
    sequence anyway (docs/semantics.md §3) and RoPE positions then never exceed seq_len. The first token of a
    document gets label -100 (it cannot be predicted from the previous document). A trailing
    partial row is dropped. `source` names where the tokens came from (a file), for error messages.
    """

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, source: str | None = None) -> None:
        if doc_starts.size and tokens.shape != doc_starts.shape:
            raise ValueError("tokens and doc_starts must have the same shape")
        self.tokens = tokens
        self.doc_starts = doc_starts
        self.seq_len = seq_len
        self.source = source
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if len(self) == 0:
            raise DataError(f"only {tokens.size} tokens: not enough for one sequence of {seq_len} (data.seq_len)",
                            source)

    def __len__(self) -> int:
        return self.tokens.size // self.seq_len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        lo, hi = index * self.seq_len, (index + 1) * self.seq_len
        ids = torch.from_numpy(np.asarray(self.tokens[lo:hi], dtype=np.int64))
        starts = torch.from_numpy(self.doc_starts[lo:hi].copy())
        starts[0] = True
        positions = positions_within_documents(starts)
        return {"input_ids": ids, "position_ids": positions, "labels": ids.masked_fill(starts, IGNORE_INDEX)}


def pack_documents(documents: Iterable[Sequence[int]], seq_len: int, source: str | None = None) -> PackedTokenDataset:
    """Concatenate token documents (empty ones skipped) into a `PackedTokenDataset`."""
    token_parts: list[np.ndarray] = []
    for doc in documents:
        arr = np.asarray(doc, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError("each document must be a flat list of token ids")
        if arr.size:
            token_parts.append(arr)
    if not token_parts:
        raise DataError("no non-empty documents to pack", source)
    tokens = np.concatenate(token_parts)
    starts = np.zeros(tokens.size, dtype=bool)
    starts[np.cumsum([0] + [part.size for part in token_parts[:-1]])] = True
    dtype = np.int32 if tokens.max() < 2**31 else np.int64
    return PackedTokenDataset(tokens.astype(dtype), starts, seq_len, source)


def read_jsonl_documents(
    path: str | Path, tokenizer: Any | None, text_field: str = "text", ids_field: str = "input_ids",
    append_eos: bool = True, eos_token_id: int | None = None, vocab_size: int | None = None,
) -> Iterator[list[int]]:
    """Yield one token list per jsonl line: `ids_field` as is, or `text_field` run through the tokenizer.

    With `append_eos` an end-of-text token closes each tokenized text (pre-tokenized ids are kept
    exactly as given), so the model learns where documents end. Every line is checked as it is read,
    and a bad one raises a `DataError` naming the file, its 1-based line and the field: invalid JSON,
    neither field present, ids that are not a list of integers, ids outside [0, vocab_size) (only
    negative ids without a `vocab_size`), a text line without a tokenizer. A missing or empty file fails
    on the call itself; a file with only blank lines when the lines run out.
    """
    file = existing_data_file(path, "the jsonl data path")
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    if vocab_size is not None and append_eos and eos is not None and not 0 <= eos < vocab_size:
        raise DataError(f"the end-of-text id {eos} is outside the model's vocabulary [0, {vocab_size})", file)
    fields = _JsonlFields(text_field, ids_field, eos if append_eos else None, vocab_size)
    return _jsonl_documents(file, tokenizer, fields)


@dataclass(frozen=True)
class _JsonlFields:
    """How a jsonl line becomes token ids (the settings of `read_jsonl_documents`)."""

    text_field: str
    ids_field: str
    eos_token_id: int | None
    vocab_size: int | None


def _jsonl_documents(file: Path, tokenizer: Any | None, fields: _JsonlFields) -> Iterator[list[int]]:
    """The lazy part of `read_jsonl_documents`: one checked token list per non-blank line."""
    data_lines = 0
    with open(file, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            data_lines += 1
            yield _line_tokens(json_object(line, file, line_no), tokenizer, fields, file, line_no)
    if data_lines == 0:
        raise DataError("the data file has only blank lines: no documents", file)


def _line_tokens(record: dict[str, Any], tokenizer: Any | None, fields: _JsonlFields, file: Path,
                 line_no: int) -> list[int]:
    """The token ids of one jsonl record, checked; see `read_jsonl_documents`."""
    if fields.ids_field in record:
        ids = _integer_ids(record[fields.ids_field], f"field {fields.ids_field!r}", file, line_no)
        what = f"field {fields.ids_field!r}"
    elif fields.text_field in record:
        text = record[fields.text_field]
        if not isinstance(text, str):
            raise DataError(f"field {fields.text_field!r} must be a string, got {type(text).__name__}", file, line_no)
        if tokenizer is None:
            raise DataError(
                f"field {fields.text_field!r} holds text but no tokenizer was given (set data.tokenizer in a "
                f"training config), or give token ids in field {fields.ids_field!r}",
                file, line_no)
        ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        if fields.eos_token_id is not None:  # closes each text (None without append_eos)
            ids.append(int(fields.eos_token_id))
        what = f"the tokenizer's ids for field {fields.text_field!r}"
    else:
        raise DataError(f"the line has neither the ids field {fields.ids_field!r} nor the text field "
                        f"{fields.text_field!r} (keys: {', '.join(map(repr, record)) or 'none'})", file, line_no)
    bad = _out_of_range(np.asarray(ids, dtype=np.int64), fields.vocab_size) if ids else None
    if bad is not None:
        raise DataError(f"{what}: item {bad} is token id {ids[bad]}, out of range: {_allowed(fields.vocab_size)}",
                        file, line_no)
    return ids


def _integer_ids(value: Any, what: str, file: Path, line_no: int) -> list[int]:
    """A JSON list of integers as token ids (no floats, strings or booleans: they would be guessed at)."""
    if not isinstance(value, list):
        raise DataError(f"{what} must be a list of integer token ids, got {type(value).__name__}", file, line_no)
    for index, item in enumerate(value):
        if type(item) is not int or not -(2**63) <= item < 2**63:  # bool is an int subclass: refused too
            raise DataError(f"{what}: item {index} is {item!r}, not an integer token id", file, line_no)
    return value


# ---------------------------------------------------------------------------------------------
# Token range: every id the model embeds or scores must be in its vocabulary


DEFAULT_SAMPLE_ROWS = 64  # a wrong vocabulary shows on any row; 64 S5 rows take about half a second
_SCAN_CHUNK = 1 << 24


def check_token_range(dataset: Dataset, vocab_size: int, sample_rows: int = DEFAULT_SAMPLE_ROWS,
                      name: str = "data") -> None:
    """Raise a `DataError` if a token id of `dataset` lies outside [0, vocab_size).

    Why before the model is built: an id past the embedding table otherwise fails only at the first
    training step, as an index error deep inside the embedding, after the model was built. Packed token
    streams (jsonl data) are scanned in full, in chunks;
    any other dataset (a factory's rows made on demand) is checked on `sample_rows` rows spread evenly
    over it, inputs and labels both. `name` says which data it is (e.g. `eval.data`) in the message.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if isinstance(dataset, PackedTokenDataset):
        _scan_token_array(dataset.tokens, vocab_size, dataset.source, name)
        return
    for index in _spread_indices(len(dataset), sample_rows):
        row = dataset[index]
        for key in ("input_ids", "labels"):
            if key not in row:
                continue
            ids = torch.as_tensor(row[key]).reshape(-1).numpy()
            if key == "labels":
                ids = ids[ids != IGNORE_INDEX]
            bad = _out_of_range(ids, vocab_size)
            if bad is not None:
                raise DataError(f"{name}: row {index}, {key}: token id {int(ids[bad])} is outside the model's "
                                f"vocabulary [0, {vocab_size})")


def _spread_indices(size: int, count: int) -> list[int]:
    """Up to `count` distinct indices spread evenly over [0, size), first and last included."""
    if size < 1 or count < 1:
        return []
    return sorted({int(i) for i in np.linspace(0, size - 1, min(size, count)).round()})


def _scan_token_array(tokens: np.ndarray, vocab_size: int, source: str | None, name: str) -> None:
    """Every id of a (possibly memory-mapped) token array within [0, vocab_size), read in chunks."""
    if tokens.dtype.kind == "u" and np.iinfo(tokens.dtype).max < vocab_size:
        return  # the dtype cannot hold an id outside the vocabulary
    chunks = range(0, tokens.size, _SCAN_CHUNK)
    bar = tqdm(chunks, desc=f"checking {name} token ids", unit="chunk", disable=len(chunks) < 8 or off_main_rank(),
               leave=False)
    for lo in bar:
        bad = _out_of_range(np.asarray(tokens[lo : lo + _SCAN_CHUNK]), vocab_size)
        if bad is not None:
            where = f"{name}: " if source is None else ""
            raise DataError(f"{where}token {lo + bad:,} of the stream is id {int(tokens[lo + bad])}, outside the "
                            f"model's vocabulary [0, {vocab_size})", source)


# ---------------------------------------------------------------------------------------------
# Building a dataset from config


def build_dataset(cfg: DataConfig, vocab_size: int | None = None, name: str = "data") -> Dataset:
    """The dataset a data config describes (see `DataConfig`).

    Bad data raise a `DataError` here, before any training: a missing or empty file, a bad jsonl line
    (file and line named). With `vocab_size` (the model's, read from its config before the model is
    built) every token id is also checked against [0, vocab_size): jsonl lines as they are read (file
    and line named), token shards by their dtype or a full chunked scan, other datasets on a sample of rows
    (`check_token_range`); the pad and end-of-text ids too. `name` is the config section (`data`,
    `eval.data`) the messages name.
    """
    if vocab_size is not None:
        _check_special_ids(cfg, vocab_size, name)
    if cfg.source == "jsonl":
        tokenizer = _data_tokenizer(cfg, name)
        if tokenizer is not None and cfg.append_eos and cfg.eos_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError(f"{name}.append_eos is set but the tokenizer has no eos token: set {name}.eos_token_id")
        file = existing_data_file(cfg.path, f"{name}.path")
        docs = read_jsonl_documents(file, tokenizer, cfg.text_field, cfg.ids_field, cfg.append_eos,
                                    cfg.eos_token_id, vocab_size)
        return pack_documents(docs, cfg.seq_len, source=str(file))
    dataset: Dataset
    if cfg.source == "shards":

        try:
            dataset = ShardedTokenDataset(cfg.path, cfg.seq_len)
        except CorpusError as err:
            raise DataError(f"{name}.path: {err}") from err
    elif cfg.source in ("synthetic", "factory"):
        dataset = _call_factory(cfg, name)
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"{name}.factory {cfg.factory!r} must return a map-style Dataset, got {type(dataset)}")
        if len(dataset) == 0:
            raise DataError(f"{name}: the dataset has no rows")
    else:
        raise ValueError(f"unknown data source {cfg.source!r}")
    if vocab_size is not None:
        check_token_range(dataset, vocab_size, name=name)
    return dataset


def _call_factory(cfg: DataConfig, name: str) -> Dataset:
    """The factory's dataset; a missing file or a bad value it reports becomes a DataError naming the factory."""
    factory = dataset_callable(cfg)
    kwargs = dataset_kwargs(cfg)
    try:
        return factory(**kwargs)
    except DataError:
        raise
    except (FileNotFoundError, ValueError) as err:
        label = "SyntheticChainDataset" if cfg.source == "synthetic" else cfg.factory
        raise DataError(f"{name}: {label}: {err}") from err


def _data_tokenizer(cfg: DataConfig, name: str) -> Any | None:
    """The tokenizer `data.tokenizer` names (None when unset); one that cannot be loaded is a DataError."""
    if not cfg.tokenizer:
        return None
    try:
        return load_tokenizer(cfg.tokenizer)
    except TokenizerNotFoundError as err:
        raise DataError(f"{name}.tokenizer: {err}") from err


def _check_special_ids(cfg: DataConfig, vocab_size: int, name: str) -> None:
    """The pad id (used when rows differ in length) and the configured EOS id must be embeddable."""
    for key, value in (("pad_token_id", cfg.pad_token_id), ("eos_token_id", cfg.eos_token_id)):
        if value is not None and not 0 <= value < vocab_size:
            raise DataError(f"{name}.{key} = {value} is outside the model's vocabulary [0, {vocab_size})")


def labels_aligned(dataset: Dataset, cfg: DataConfig) -> bool:
    """The config wins when set; otherwise the dataset's own `labels_aligned_to_inputs` attribute."""
    if cfg.labels_aligned_to_inputs is not None:
        return cfg.labels_aligned_to_inputs
    return bool(getattr(dataset, "labels_aligned_to_inputs", False))


# ---------------------------------------------------------------------------------------------
# Collation


class Collator:
    """Stack dataset items into a batch dict the model's forward accepts.

    Rows of unequal length are right-padded (input pad_token_id, label -100, attention_mask 0); when
    every row has the same length no attention_mask is produced, which keeps packed rows on the
    position_ids-only path. With `labels_aligned_to_inputs=True`, labels are shifted right by one
    (label[0] = -100) so that the model's internal causal shift scores logits[t] against the
    aligned target at t.
    """

    def __init__(self, pad_token_id: int = 0, labels_aligned_to_inputs: bool = False) -> None:
        self.pad_token_id = pad_token_id
        self.labels_aligned_to_inputs = labels_aligned_to_inputs

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        rows = [self._prepare(item) for item in items]
        lengths = [row["input_ids"].numel() for row in rows]
        width = max(lengths)
        batch = {key: torch.stack([_pad(row[key], width, _pad_value(key, self.pad_token_id)) for row in rows])
                 for key in rows[0]}
        if "position_ids" in batch:
            for i, (row, n) in enumerate(zip(rows, lengths)):
                tail = row["position_ids"][-1] + 1 if n else 0
                batch["position_ids"][i, n:] = torch.arange(width - n) + tail
        if min(lengths) != width:
            batch["attention_mask"] = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
        return batch

    def widen(self, batch: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
        """`batch` right-padded to `width` columns, as if a row that long had been in it: padding that is
        masked from attention and from the loss, with positions that continue each row's. FSDP ranks pad to
        a common width: the exact path runs the middle block once per column, and FSDP2's collectives run
        with it, so unequal widths would leave the ranks waiting on each other."""
        current = batch["input_ids"].shape[1]
        if width <= current:
            return batch
        extra = width - current
        widened = {key: torch.cat([value, value.new_full((value.shape[0], extra), _pad_value(key, self.pad_token_id))],
                                  dim=1) if value.dim() == 2 and value.shape[1] == current else value
                   for key, value in batch.items()}
        if "position_ids" in batch:
            widened["position_ids"][:, current:] = batch["position_ids"][:, -1:] + 1 + torch.arange(extra)
        if "attention_mask" not in batch:
            widened["attention_mask"] = torch.cat([torch.ones_like(batch["input_ids"]),
                                                   torch.zeros_like(batch["input_ids"][:, :1]).expand(-1, extra)], dim=1)
        return widened

    def _prepare(self, item: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        row = {key: torch.as_tensor(value) for key, value in item.items()}
        if "input_ids" not in row:
            raise KeyError("dataset items must contain 'input_ids'")
        ids = row["input_ids"].long()
        row["input_ids"] = ids
        if "labels" not in row:
            labels = ids.clone()
            if "position_ids" in row:
                labels[row["position_ids"] == 0] = IGNORE_INDEX
            row["labels"] = labels
        elif self.labels_aligned_to_inputs:
            row["labels"] = shift_aligned_labels(row["labels"].long())
        else:
            row["labels"] = row["labels"].long()
        return row


def shift_aligned_labels(labels: torch.Tensor) -> torch.Tensor:
    """Transduction labels (target for t at t) → causal-LM labels (target for t at t+1)."""
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[1:] = labels[:-1]
    return shifted


def _pad_value(key: str, pad_token_id: int) -> int:
    return {"input_ids": pad_token_id, "labels": IGNORE_INDEX}.get(key, 0)


def _pad(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return F.pad(tensor, (0, width - tensor.numel()), value=value)


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Number of scored tokens in a batch after the model's causal shift."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


# ---------------------------------------------------------------------------------------------
# Deterministic, resumable sampling


class ResumableBatchSampler(Sampler[list[int]]):
    """Micro-batches of dataset indices for one rank, starting at optimizer step `start_step`.

    Global sample g (counting from the start of training) is permutation_e[g mod N] with epoch
    e = g // N and a permutation seeded by (seed, e). Global batch s holds samples s·B..(s+1)·B−1;
    its micro-step m gives rank r the slice of `micro_batch_size` samples at offset
    (m·world + r)·micro. So a single process with micro × world samples per micro-step sees exactly
    the samples the ranks of a torchrun job see together, and resuming only needs `start_step`.
    """

    def __init__(
        self, num_samples: int, global_batch_size: int, micro_batch_size: int, seed: int = 0,
        rank: int = 0, world_size: int = 1, start_step: int = 0, shuffle: bool = True,
    ) -> None:
        if global_batch_size % (micro_batch_size * world_size):
            raise ValueError(
                f"global batch {global_batch_size} is not a multiple of micro batch {micro_batch_size} × "
                f"world size {world_size}"
            )
        if num_samples < 1:
            raise DataError("data: the training dataset is empty")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start_step = start_step
        self.shuffle = shuffle
        self.accum_steps = global_batch_size // (micro_batch_size * world_size)
        self._perm_epoch = -1
        self._perm = np.arange(num_samples)

    def _sample(self, g: int) -> int:
        epoch, offset = divmod(g, self.num_samples)
        if not self.shuffle:
            return offset
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._perm_epoch = epoch
        return int(self._perm[offset])

    def micro_batch(self, step: int, micro: int) -> list[int]:
        """Dataset indices of micro-step `micro` of optimizer step `step` for this rank."""
        base = step * self.global_batch_size + (micro * self.world_size + self.rank) * self.micro_batch_size
        return [self._sample(base + k) for k in range(self.micro_batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            for micro in range(self.accum_steps):
                yield self.micro_batch(step, micro)
            step += 1

    def __len__(self) -> int:
        raise TypeError("ResumableBatchSampler is infinite; the trainer stops it at max_steps")


class StepBatches:
    """Groups the sampler's micro-batches into optimizer steps: `next()` → list of `accum_steps` batches."""

    def __init__(self, dataset: Dataset, sampler: ResumableBatchSampler, collator: Collator, num_workers: int = 0):
        self.accum_steps = sampler.accum_steps
        # A private generator: creating the loader's iterator must not draw from the global RNG, or a
        # resumed run (which creates it after restoring RNG states) would diverge from a straight one.
        generator = torch.Generator().manual_seed(sampler.seed)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, num_workers=num_workers,
                            persistent_workers=num_workers > 0, generator=generator)
        self._iter = iter(loader)

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        return [next(self._iter) for _ in range(self.accum_steps)]


def eval_batches(
    cfg: DataConfig, vocab_size: int, batch_size: int, max_batches: int, rank: int = 0, world_size: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """A fixed evaluation set of the eval data `cfg` (`eval.data`, its token ids checked against `vocab_size`): the
    first `max_batches` global batches of `batch_size` rows, this rank's slices.

    The set does not depend on the number of ranks, and every rank gets the same number of batches
    (FSDP runs collectives inside forward).
    """
    dataset = build_dataset(cfg, vocab_size=vocab_size, name="eval.data")
    collator = Collator(cfg.pad_token_id, labels_aligned(dataset, cfg))
    if batch_size % world_size:
        raise ValueError(f"eval.batch_size {batch_size} must be a multiple of the number of ranks {world_size}")
    per_rank = batch_size // world_size
    n = min(max_batches, len(dataset) // batch_size)
    if n < 1:
        raise DataError(f"eval.data: the eval dataset has {len(dataset)} rows, fewer than one eval batch of "
                        f"{batch_size} (eval.batch_size)")
    starts = (b * batch_size + rank * per_rank for b in range(n))
    return [collator([dataset[i] for i in range(lo, lo + per_rank)]) for lo in starts]
