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

Sampling is a pure function of (seed, step): the position in the data stream is just the number of
optimizer steps taken, which is what a checkpoint stores, and every rank of a torchrun job derives
its own share of each global batch from it.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from t2mlr.model.layout import positions_within_documents
from t2mlr.training.config import DataConfig
from t2mlr.utils import IGNORE_INDEX, check_known_names, load_tokenizer, signature_fields



# ---------------------------------------------------------------------------------------------
# Packing


class PackedTokenDataset(Dataset):
    """Documents concatenated into one token stream and cut into rows of `seq_len` tokens.

    Positions restart at 0 at every document start and at every row start: a document cut by a row
    boundary continues as a new document in the next row, because R_0 = 0 at the start of every
    sequence anyway (docs/semantics.md §3) and RoPE positions then never exceed seq_len. The first token of a
    document gets label -100 (it cannot be predicted from the previous document). A trailing
    partial row is dropped.
    """

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int) -> None:
        if doc_starts.size and tokens.shape != doc_starts.shape:
            raise ValueError("tokens and doc_starts must have the same shape")
        self.tokens = tokens
        self.doc_starts = doc_starts
        self.seq_len = seq_len
        if len(self) == 0:
            raise ValueError(f"only {tokens.size} tokens: not enough for one sequence of {seq_len}")

    def __len__(self) -> int:
        return self.tokens.size // self.seq_len

    def _starts(self, lo: int, hi: int) -> np.ndarray:
        return self.doc_starts[lo:hi].copy()

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        lo, hi = index * self.seq_len, (index + 1) * self.seq_len
        ids = torch.from_numpy(np.asarray(self.tokens[lo:hi], dtype=np.int64))
        starts = torch.from_numpy(self._starts(lo, hi))
        starts[0] = True
        positions = positions_within_documents(starts)
        labels = ids.clone()
        labels[starts] = IGNORE_INDEX
        return {"input_ids": ids, "position_ids": positions, "labels": labels}


class TokenFileDataset(PackedTokenDataset):
    """A pre-tokenized token stream in a `.npy` file (memory-mapped), documents separated by EOS.

    For pretraining-scale data: nothing is loaded up front. A token directly after `eos_token_id`
    starts a new document. Produce the file with `write_token_file` (or `python -m t2mlr.training
    tokenize`).
    """

    def __init__(self, path: str | Path, seq_len: int, eos_token_id: int) -> None:
        tokens = np.load(path, mmap_mode="r")
        if tokens.ndim != 1:
            raise ValueError(f"{path}: expected a 1-D token array, got shape {tokens.shape}")
        self.eos_token_id = eos_token_id
        super().__init__(tokens, np.zeros(0, dtype=bool), seq_len)

    def _starts(self, lo: int, hi: int) -> np.ndarray:
        starts = np.zeros(hi - lo, dtype=bool)  # starts[0] is set by the caller (every row starts a document)
        starts[1:] = np.asarray(self.tokens[lo : hi - 1]) == self.eos_token_id
        return starts


def write_token_file(
    documents: Iterable[Sequence[int]], path: str | Path, eos_token_id: int, chunk_tokens: int = 1 << 24,
) -> int:
    """Concatenate documents, each closed by EOS unless it already ends with it, into a `.npy` stream.

    Streams through a temporary raw file, so memory stays bounded by `chunk_tokens` at corpus scale.
    Returns the number of tokens written; uint16 when the ids fit (SmolLM2's 49152-token vocabulary
    does), else uint32.
    """
    path = Path(path)
    raw = path.with_name(path.name + ".raw.tmp")
    count, largest, buffered, buffer = 0, 0, 0, []
    with open(raw, "wb") as handle:
        for doc in documents:
            arr = np.asarray(doc, dtype=np.int64)
            if arr.size == 0:
                continue
            if arr.min() < 0 or arr.max() >= 2**32:
                raise ValueError("token ids must lie in [0, 2**32)")
            if arr[-1] != eos_token_id:
                arr = np.append(arr, eos_token_id)
            buffer.append(arr.astype(np.uint32))
            count, buffered, largest = count + arr.size, buffered + arr.size, max(largest, int(arr.max()))
            if buffered >= chunk_tokens:
                np.concatenate(buffer).tofile(handle)
                buffer, buffered = [], 0
        if buffer:
            np.concatenate(buffer).tofile(handle)
    try:
        if count == 0:
            raise ValueError("no documents to write")
        source = np.memmap(raw, dtype=np.uint32, mode="r", shape=(count,))
        dtype = np.uint16 if largest < 2**16 else np.uint32
        target = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(count,))
        for lo in range(0, count, chunk_tokens):
            target[lo : lo + chunk_tokens] = source[lo : lo + chunk_tokens]
        target.flush()
        del target, source
    finally:
        raw.unlink(missing_ok=True)
    return count


def pack_documents(documents: Iterable[Sequence[int]], seq_len: int) -> PackedTokenDataset:
    """Concatenate token documents (empty ones skipped) into a `PackedTokenDataset`."""
    token_parts: list[np.ndarray] = []
    start_parts: list[np.ndarray] = []
    for doc in documents:
        arr = np.asarray(doc, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError("each document must be a flat list of token ids")
        if arr.size == 0:
            continue
        starts = np.zeros(arr.size, dtype=bool)
        starts[0] = True
        token_parts.append(arr)
        start_parts.append(starts)
    if not token_parts:
        raise ValueError("no non-empty documents to pack")
    tokens = np.concatenate(token_parts)
    dtype = np.int32 if tokens.max() < 2**31 else np.int64
    return PackedTokenDataset(tokens.astype(dtype), np.concatenate(start_parts), seq_len)


def read_jsonl_documents(
    path: str | Path, tokenizer: Any | None, text_field: str = "text", ids_field: str = "input_ids",
    append_eos: bool = True, eos_token_id: int | None = None,
) -> Iterator[list[int]]:
    """Yield one token list per jsonl line: `ids_field` as is, or `text_field` run through the tokenizer.

    With `append_eos` an end-of-text token closes each tokenized text (pre-tokenized ids are kept
    exactly as given), so the model learns where documents end.
    """
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if ids_field in record:
                yield [int(t) for t in record[ids_field]]
            elif text_field in record:
                eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
                yield _tokenize_text(record[text_field], tokenizer, eos if append_eos else None, f"{path}:{line_no}")
            else:
                raise ValueError(f"{path}:{line_no}: line has neither {ids_field!r} nor {text_field!r}")


def _tokenize_text(text: str, tokenizer: Any | None, eos_token_id: int | None, where: str) -> list[int]:
    """Token ids of one text, closed by `eos_token_id` unless it is None."""
    if tokenizer is None:
        raise ValueError(f"{where}: a text line needs data.tokenizer (a tokenizer path or hub id)")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if eos_token_id is not None:
        ids.append(int(eos_token_id))
    return ids


# ---------------------------------------------------------------------------------------------
# Synthetic data (smoke runs and tests: no files, learnable in a few dozen steps)


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
        labels = ids.clone()
        labels[start_mask] = IGNORE_INDEX
        return {"input_ids": ids, "position_ids": positions_within_documents(start_mask), "labels": labels}


# ---------------------------------------------------------------------------------------------
# Building a dataset from config


def build_dataset(cfg: DataConfig) -> Dataset:
    """The dataset a data config describes (see `DataConfig`)."""
    if cfg.source == "jsonl":
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        if tokenizer is not None and cfg.append_eos and cfg.eos_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("data.append_eos is set but the tokenizer has no eos token: set data.eos_token_id")
        docs = read_jsonl_documents(cfg.path, tokenizer, cfg.text_field, cfg.ids_field, cfg.append_eos,
                                    cfg.eos_token_id)
        return pack_documents(docs, cfg.seq_len)
    if cfg.source == "tokens":
        if cfg.eos_token_id is None:
            raise ValueError("data.source=tokens needs data.eos_token_id (the document separator)")
        return TokenFileDataset(cfg.path, cfg.seq_len, cfg.eos_token_id)
    if cfg.source in ("synthetic", "factory"):
        dataset = dataset_callable(cfg)(**dataset_kwargs(cfg))
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"data.factory {cfg.factory!r} must return a map-style Dataset, got {type(dataset)}")
        return dataset
    raise ValueError(f"unknown data source {cfg.source!r}")


SYNTHETIC_DEFAULTS = {"num_samples": 4096, "vocab_size": 64}


def dataset_callable(cfg: DataConfig) -> Callable[..., Dataset]:
    """What `data.kwargs` are passed to: `SyntheticChainDataset`, or the imported `data.factory`."""
    if cfg.source == "synthetic":
        return SyntheticChainDataset
    module_name, _, attr = (cfg.factory or "").partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"data.factory {cfg.factory!r} cannot be imported: {err}") from err


def dataset_kwargs(cfg: DataConfig) -> dict[str, Any]:
    """`data.kwargs` checked name by name against the callable's own parameters (the nearest valid name in
    the error) and coerced to their declared types, plus seq_len and seed from the data config."""
    from t2mlr.training.config import coerce_declared

    target = dataset_callable(cfg)
    fields = signature_fields(target.__init__ if isinstance(target, type) else target)
    name = "SyntheticChainDataset" if cfg.source == "synthetic" else cfg.factory
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(target).parameters.values())
    if not takes_any:
        check_known_names(cfg.kwargs, fields, f"keyword of {name} in data.kwargs")
    kwargs = {key: coerce_declared(value, fields[key].type, f"data.kwargs.{key}") if key in fields else value
              for key, value in cfg.kwargs.items()}
    if cfg.source == "synthetic":
        kwargs = {**SYNTHETIC_DEFAULTS, **kwargs}
    accepted = inspect.signature(target).parameters
    for key, value in (("seq_len", cfg.seq_len), ("seed", cfg.seed)):  # unless data.kwargs sets them
        if key in accepted and key not in kwargs:
            kwargs[key] = value
    return kwargs


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
        width = max(row["input_ids"].numel() for row in rows)
        padded = any(row["input_ids"].numel() != width for row in rows)
        keys = rows[0].keys()
        batch = {key: torch.stack([_pad(row[key], width, _pad_value(key, self.pad_token_id)) for row in rows])
                 for key in keys}
        if "position_ids" in batch:
            for i, row in enumerate(rows):
                n = row["input_ids"].numel()
                tail = row["position_ids"][-1] + 1 if n else 0
                batch["position_ids"][i, n:] = torch.arange(width - n) + tail
        if padded:
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for i, row in enumerate(rows):
                mask[i, : row["input_ids"].numel()] = 1
            batch["attention_mask"] = mask
        return batch

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
    if tensor.numel() == width:
        return tensor
    return torch.cat([tensor, torch.full((width - tensor.numel(),), value, dtype=tensor.dtype)])


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
            raise ValueError("the dataset is empty")
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
    dataset: Dataset, collator: Collator, batch_size: int, max_batches: int, rank: int = 0, world_size: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """A fixed evaluation set: the first `max_batches` global batches of `batch_size` rows, this rank's slices.

    The set does not depend on the number of ranks, and every rank gets the same number of batches
    (FSDP runs collectives inside forward).
    """
    if batch_size % world_size:
        raise ValueError(f"eval.batch_size {batch_size} must be a multiple of the number of ranks {world_size}")
    per_rank = batch_size // world_size
    n = min(max_batches, len(dataset) // batch_size)
    if n < 1:
        raise ValueError(f"eval dataset has {len(dataset)} rows, fewer than one eval batch of {batch_size}")
    batches = []
    for b in range(n):
        lo = b * batch_size + rank * per_rank
        batches.append(collator([dataset[i] for i in range(lo, lo + per_rank)]))
    return batches
