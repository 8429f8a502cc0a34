"""On-disk layout of a tokenized corpus: token shards, their document index, and the manifest.

A corpus directory holds

- ``shard_00000.bin``, ...: raw little-endian token ids (``uint16`` when the vocabulary fits, else
  ``uint32``), every document followed by EOS; read with ``np.memmap``;
- ``shard_00000.offsets.npy``, ...: int64, the start of every document in its shard plus the shard's
  length at the end (documents never straddle shards);
- ``manifest.json``: tokenizer, dtype, settings, every shard (token and document counts, bytes,
  sha256, and the input cursor just after its last document) and every input file with what was read.

Every file is written under a temporary name, fsync'ed and renamed, and the manifest is replaced
after each finished shard: it is the commit point. A directory whose manifest says
``"complete": false`` is a run that was interrupted and can be resumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from t2mlr.corpus.errors import CorpusError
from t2mlr.utils import fsync_directory, sha256_of_file, write_text_atomic

MANIFEST = "manifest.json"
FORMAT_NAME = "t2mlr-token-shards"
FORMAT_VERSION = 1
TEMP_SUFFIX = ".tmp"
_OUR_FILE = re.compile(r"(shard_\d{5,}\.(bin|offsets\.npy)|manifest\.json)(\.tmp)?")


def shard_file_names(index: int) -> tuple[str, str]:
    """(token file, offsets file) of shard `index`."""
    return f"shard_{index:05d}.bin", f"shard_{index:05d}.offsets.npy"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of a vocabulary of `vocab_size` tokens."""
    if vocab_size <= 0:
        raise CorpusError(f"vocabulary size must be positive, got {vocab_size}")
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise CorpusError(f"vocabulary of {vocab_size} tokens does not fit in uint32")


def manifest_text(data: dict[str, Any]) -> str:
    """JSON with one line per top-level key and per shard/input record: readable, and written by the C
    encoder (an indented `json.dump` of thousands of shard records takes seconds, once per shard)."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            items = ",\n".join("  " + json.dumps(item) for item in value)
            lines.append(f"{json.dumps(key)}: [\n{items}\n ]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, manifest_text(data), path.with_name(path.name + TEMP_SUFFIX))


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{directory}: no {MANIFEST}; not a tokenized corpus directory") from None
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}: not valid JSON ({err})") from None
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise CorpusError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}; "
            f"expected {FORMAT_NAME!r} version {FORMAT_VERSION}"
        )
    return manifest


def own_files(directory: Path) -> list[Path]:
    """Files in `directory` that this module writes (shards, offsets, manifest, their temp names)."""
    return sorted(p for p in directory.iterdir() if _OUR_FILE.fullmatch(p.name))


class ShardWriter:
    """One shard being written: tokens streamed to a temp file, document lengths kept in memory
    (8 bytes a document), both renamed into place by `finish`."""

    def __init__(self, directory: Path, index: int, dtype: np.dtype, first_document: int) -> None:
        self.directory = directory
        self.index = index
        self.dtype = dtype
        self.first_document = first_document
        self.tokens_name, self.offsets_name = shard_file_names(index)
        self._temp_tokens = directory / (self.tokens_name + TEMP_SUFFIX)
        self._temp_offsets = directory / (self.offsets_name + TEMP_SUFFIX)
        self._handle = open(self._temp_tokens, "wb")  # noqa: SIM115 (closed by finish/abort)
        self._digest = hashlib.sha256()
        self._lengths: list[np.ndarray] = []
        self.num_tokens = 0
        self.num_documents = 0

    def append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Add whole documents: their tokens (EOS included) and each one's length."""
        if tokens.dtype != self.dtype or int(lengths.sum()) != tokens.size:
            raise ValueError("tokens must have the shard's dtype and lengths must sum to their count")
        data = np.ascontiguousarray(tokens).view(np.uint8)
        self._handle.write(data)
        self._digest.update(data)
        self._lengths.append(lengths.astype(np.int64, copy=False))
        self.num_tokens += tokens.size
        self.num_documents += lengths.size

    def finish(self, end: dict[str, int]) -> dict[str, Any]:
        """fsync and rename both files into place; the shard's manifest record (`end`: the input cursor
        just after its last document)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        with open(self._temp_offsets, "wb") as handle:
            np.save(handle, offsets)
            handle.flush()
            os.fsync(handle.fileno())
        offsets_sha = sha256_of_file(self._temp_offsets)
        os.replace(self._temp_offsets, self.directory / self.offsets_name)
        os.replace(self._temp_tokens, self.directory / self.tokens_name)
        fsync_directory(self.directory)
        return {
            "tokens": self.tokens_name, "offsets": self.offsets_name, "num_tokens": self.num_tokens,
            "num_documents": self.num_documents, "first_document": self.first_document,
            "bytes": self.num_tokens * self.dtype.itemsize, "sha256": self._digest.hexdigest(),
            "offsets_sha256": offsets_sha, "end": end,
        }

    def abort(self) -> None:
        """Delete the temp files: nothing of an unfinished shard stays behind."""
        self._handle.close()
        self._temp_tokens.unlink(missing_ok=True)
        self._temp_offsets.unlink(missing_ok=True)
