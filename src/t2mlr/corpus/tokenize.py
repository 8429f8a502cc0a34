"""Tokenize a text corpus into memory-mapped token shards, in parallel, resumably.

    manifest = tokenize_corpus("data/*.parquet", tokenizer, "tokens/", workers=8)

How the work is split, and why resuming gives the same bytes: the main process reads the inputs
in order (`DocumentStream`, streaming) and cuts them into batches of about `batch_chars` characters;
`workers` processes tokenize the batches (the tokenizer's own batch call, one core each); results are
taken back in submission order, so the token stream is the documents' order whatever the number of
workers. A shard closes after the document that brings it to `shard_tokens` tokens, so shard
boundaries depend only on the documents and `shard_tokens`. Each finished shard is renamed into place
and recorded in the manifest together with the input cursor just after its last document; a resumed
run deletes whatever an interruption left half-written and restarts reading at the last recorded
cursor. At most a few batches per worker are in flight, so memory stays flat however large the
input.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from t2mlr.corpus.errors import CorpusError
from t2mlr.corpus.shards import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    TEMP_SUFFIX,
    ShardWriter,
    own_files,
    read_manifest,
    token_dtype,
    write_json_atomic,
)
from t2mlr.corpus.sources import (
    Cursor,
    DocumentStream,
    InputFile,
    TxtDocuments,
    resolve_inputs,
)
from t2mlr.utils import TokenizerNotFoundError, exit_when_orphaned
from t2mlr.utils import load_tokenizer as load_any_tokenizer

DEFAULT_SHARD_TOKENS = 1 << 27  # 128 Mi tokens: 256 MiB uint16 shards
DEFAULT_BATCH_CHARS = 1 << 20
_BATCH_DOCUMENTS = 4096  # also caps a batch of tiny documents
_BATCHES_IN_FLIGHT_PER_WORKER = 2


# ---------------------------------------------------------------------------------------------
# Tokenizer


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer from a directory, a `tokenizer.json` file, or a hub id (`t2mlr.utils.load_tokenizer`),
    its failure a `CorpusError`, as every corpus input error is."""
    try:
        return load_any_tokenizer(name)
    except TokenizerNotFoundError as err:
        raise CorpusError(f"tokenizer {name!r} cannot be loaded ({err})") from err


def tokenizer_record(tokenizer: Any, eos_token_id: int | None) -> dict[str, Any]:
    """What the manifest says about the tokenizer; `sha256` (of its serialized Rust tokenizer) is what
    a resumed run must match."""
    if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "backend_tokenizer"):
        raise CorpusError(
            f"{type(tokenizer).__name__} is not a fast (Rust) Hugging Face tokenizer; load one with use_fast=True"
        )
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise CorpusError("the tokenizer has no eos token: pass eos_token_id (the id appended after each document)")
    vocab_size = len(tokenizer)
    if not 0 <= int(eos) < vocab_size:
        raise CorpusError(f"eos_token_id {eos} is not an id of the tokenizer's {vocab_size} tokens")
    serialized = tokenizer.backend_tokenizer.to_str()
    return {
        "name": str(getattr(tokenizer, "name_or_path", "") or ""),
        "class": type(tokenizer).__name__,
        "vocab_size": vocab_size,
        "eos_token_id": int(eos),
        "eos_token": tokenizer.convert_ids_to_tokens(int(eos)),
        "sha256": hashlib.sha256(serialized.encode("utf-8")).hexdigest(),
    }


def encode_texts(tokenizer: Any, texts: list[str], dtype: np.dtype, eos_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of a batch of documents, each followed by EOS, as one flat array, and each document's
    length (EOS included). One batch call of the tokenizer, as fast tokenizers are meant to be used."""
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False,
                    return_token_type_ids=False)["input_ids"]
    lengths = np.fromiter((len(doc) + 1 for doc in ids), dtype=np.int64, count=len(ids))
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if ends.size else 0
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=total - len(ids))
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) > np.iinfo(dtype).max):
        raise CorpusError(f"token ids range over [{flat.min()}, {flat.max()}], outside {dtype}")
    tokens = np.empty(total, dtype=dtype)
    is_text = np.ones(total, dtype=bool)
    is_text[ends - 1] = False
    tokens[is_text] = flat
    tokens[ends - 1] = eos_token_id
    return tokens, lengths


# ---------------------------------------------------------------------------------------------
# Worker processes


_WORKER_STATE: tuple[Any, np.dtype, int] | None = None


def _init_worker(tokenizer: Any, dtype: str, eos_token_id: int, parent_pid: int) -> None:
    global _WORKER_STATE
    # One core per worker: the processes are the parallelism (and the benchmark's limit is measured so).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_STATE = (tokenizer, np.dtype(dtype), eos_token_id)
    threading.Thread(target=exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_STATE is not None, "worker not initialised"
    tokenizer, dtype, eos = _WORKER_STATE
    return encode_texts(tokenizer, texts, dtype, eos)


class _Encoder:
    """Tokenizes batches in `workers` processes (0: in this process), results in submission order."""

    def __init__(self, tokenizer: Any, workers: int, dtype: np.dtype, eos_token_id: int) -> None:
        self.tokenizer, self.dtype, self.eos = tokenizer, dtype, eos_token_id
        self.max_in_flight = max(1, workers * _BATCHES_IN_FLIGHT_PER_WORKER)
        self._pool: ProcessPoolExecutor | None = None
        if workers > 0:
            # fork: workers inherit the tokenizer and the imported modules instead of re-importing t2mlr
            # (seconds and hundreds of MB each); spawn where fork does not exist.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self._pool = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context(method), initializer=_init_worker,
                initargs=(tokenizer, dtype.name, eos_token_id, os.getpid()),
            )

    def submit(self, texts: list[str]) -> Future:
        if self._pool is not None:
            return self._pool.submit(_encode_in_worker, texts)
        future: Future = Future()
        future.set_result(encode_texts(self.tokenizer, texts, self.dtype, self.eos))
        return future

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------
# Output directory: fresh start or resume


def _check_resumable(manifest: dict[str, Any], files: Sequence[InputFile], tokenizer: dict[str, Any],
                     dtype: np.dtype, settings: dict[str, Any], out: Path) -> None:
    """Raise unless `manifest` was written by a run with the same tokenizer, settings and inputs (the
    inputs read so far unchanged), so that continuing it gives what one uninterrupted run gives."""
    differences = [key for key in settings if manifest["settings"].get(key) != settings[key]]
    if manifest["tokenizer"]["sha256"] != tokenizer["sha256"]:
        differences.append("tokenizer")
    if manifest["tokenizer"]["eos_token_id"] != tokenizer["eos_token_id"]:
        differences.append("eos_token_id")
    if manifest["dtype"] != dtype.name:
        differences.append("dtype")
    old_inputs = [(record["path"], record["format"]) for record in manifest["inputs"]]
    if old_inputs != [(file.path, file.format) for file in files]:
        differences.append("inputs")
    if differences:
        raise CorpusError(
            f"{out} holds a tokenization with other {', '.join(differences)}; pass overwrite=True to start "
            f"over, or use another output directory"
        )
    read_upto = manifest["shards"][-1]["end"]["input"] if manifest["shards"] else -1
    for index, (record, file) in enumerate(zip(manifest["inputs"], files)):
        was_read = record["status"] != "unread" or index <= read_upto
        if was_read and record["fingerprint"] != file.fingerprint:
            raise CorpusError(
                f"{file.path} changed since it was tokenized into {out} (size/modification time); "
                f"pass overwrite=True to start over"
            )


def _check_shard_files(manifest: dict[str, Any], out: Path) -> None:
    for shard in manifest["shards"]:
        path = out / shard["tokens"]
        if not path.is_file() or path.stat().st_size != shard["bytes"] or not (out / shard["offsets"]).is_file():
            raise CorpusError(f"{path} is missing or has the wrong size; pass overwrite=True to start over")


def _remove_unrecorded(out: Path, manifest: dict[str, Any] | None) -> None:
    """Delete what an interrupted run left that the manifest does not vouch for: temp files, and shards
    renamed into place just before the manifest recording them could be written."""
    recorded = {MANIFEST}
    for shard in (manifest or {}).get("shards", []):
        recorded.update((shard["tokens"], shard["offsets"]))
    for path in own_files(out):
        if path.name not in recorded or path.name.endswith(TEMP_SUFFIX):
            path.unlink()


def _prepare_output(out: Path, overwrite: bool) -> dict[str, Any] | None:
    """The manifest of a run to continue, or None for a fresh start; `out` exists afterwards."""
    if out.exists() and not out.is_dir():
        raise CorpusError(f"output {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for path in own_files(out):
            path.unlink()
    ours = set(own_files(out))
    foreign = [p.name for p in out.iterdir() if p not in ours]
    if foreign:
        raise CorpusError(f"output directory {out} holds other files ({', '.join(sorted(foreign)[:5])}); "
                          f"use an empty or new directory")
    return read_manifest(out) if (out / MANIFEST).exists() else None


# ---------------------------------------------------------------------------------------------
# The run


class _ShardSequence:
    """Cuts the ordered token stream into shards of about `shard_tokens` tokens, closing each after a
    whole document, and commits each one (files renamed, manifest replaced)."""

    def __init__(self, out: Path, manifest: dict[str, Any], stream: DocumentStream, shard_tokens: int,
                 dtype: np.dtype) -> None:
        self.out, self.manifest, self.stream = out, manifest, stream
        self.shard_tokens, self.dtype = shard_tokens, dtype
        self.documents = sum(shard["num_documents"] for shard in manifest["shards"])
        self.tokens = sum(shard["num_tokens"] for shard in manifest["shards"])
        self.current: ShardWriter | None = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray, cursors: list[Cursor]) -> None:
        ends = np.cumsum(lengths)
        first, token_start = 0, 0
        while first < lengths.size:
            if self.current is None:
                self.current = ShardWriter(self.out, len(self.manifest["shards"]), self.dtype, self.documents)
            room = self.shard_tokens - self.current.num_tokens
            fills = int(np.searchsorted(ends[first:] - token_start, room, side="left"))
            last = min(first + fills, lengths.size - 1)
            token_end = int(ends[last])
            self.current.append(tokens[token_start:token_end], lengths[first:last + 1])
            self.documents += last + 1 - first
            self.tokens += token_end - token_start
            if self.current.num_tokens >= self.shard_tokens:
                self.close(cursors[last], final=False)
            first, token_start = last + 1, token_end

    def close(self, end: Cursor, final: bool) -> None:
        """Commit the open shard (if any) and the manifest; `final` marks the corpus complete."""
        if self.current is not None:
            self.manifest["shards"].append(self.current.finish(asdict(end)))
            self.current = None
        self._update_inputs(end, final)
        self.manifest.update(complete=final, num_shards=len(self.manifest["shards"]),
                             num_documents=self.documents, num_tokens=self.tokens)
        write_json_atomic(self.out / MANIFEST, self.manifest)

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None

    def _update_inputs(self, end: Cursor, final: bool) -> None:
        """Per input: read / partial / unread, and what was consumed, as of cursor `end` (the inputs
        the reader already passed, which a resumed run would read again, count only at the end)."""
        for index, record in enumerate(self.manifest["inputs"]):
            finished = self.stream.finished.get(index)
            if finished is not None and (index < end.input or final):
                record.update(status="read", **_consumed(finished))
            elif index == end.input:
                record.update(status="partial", **_consumed(end))


def _consumed(cursor: Cursor) -> dict[str, int]:
    return {"documents": cursor.documents, "skipped_empty": cursor.skipped_empty, "lines_or_rows": cursor.line,
            "position": cursor.offset}


def _fresh_manifest(files: Sequence[InputFile], tokenizer: dict[str, Any], dtype: np.dtype,
                    settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "complete": False,
        "tokenizer": tokenizer, "dtype": dtype.name, "eos_appended": True, "settings": settings,
        "num_shards": 0, "num_documents": 0, "num_tokens": 0, "shards": [],
        "inputs": [{**asdict(file), "status": "unread", **_consumed(Cursor(index))}
                   for index, file in enumerate(files)],
    }


def _batches(stream: DocumentStream, limit: int | None, batch_chars: int) -> Iterator[tuple[list[str], list[Cursor]]]:
    """Consecutive documents grouped into batches of about `batch_chars` characters; at most `limit`
    documents in all."""
    texts: list[str] = []
    cursors: list[Cursor] = []
    chars = 0
    for text, cursor in islice(stream, limit):
        texts.append(text)
        cursors.append(cursor)
        chars += len(text)
        if chars >= batch_chars or len(texts) >= _BATCH_DOCUMENTS:
            yield texts, cursors
            texts, cursors, chars = [], [], 0
    if texts:
        yield texts, cursors


def tokenize_corpus(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    workers: int = 1,
    *,
    text_field: str = "text",
    txt_documents: TxtDocuments = "file",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    max_documents: int | None = None,
    eos_token_id: int | None = None,
    batch_chars: int = DEFAULT_BATCH_CHARS,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenize `inputs` into token shards in `out_dir` and return the manifest.

    inputs: a path, directory, glob, hub dataset id (owner/name, where the hub is reachable), or a
        list of them; parquet, jsonl, jsonl.gz and txt (see `t2mlr.corpus.sources`).
    tokenizer: a fast Hugging Face tokenizer, or its directory / tokenizer.json / hub id.
    workers: tokenizing processes (0: tokenize in this process); the output does not depend on it.
    shard_tokens: a shard closes after the document that brings it to this many tokens.
    max_documents: stop after this many (non-empty) documents.
    eos_token_id: appended after every document (default: the tokenizer's eos).
    batch_chars: characters per batch sent to a worker (memory in flight: about 2 batches a worker).
    overwrite: delete a previous tokenization in `out_dir` instead of resuming it.

    Run it again with the same arguments after an interruption and it resumes where the last finished
    shard ended; the shards come out byte-identical to an uninterrupted run. Bad input raises
    `CorpusError` and leaves no partial shard (finished shards stay, for a resume after the fix).
    """
    if workers < 0 or shard_tokens < 1 or batch_chars < 1 or (max_documents is not None and max_documents < 1):
        raise CorpusError(f"need workers >= 0, shard_tokens >= 1, batch_chars >= 1, max_documents >= 1 or None; "
                          f"got {workers}, {shard_tokens}, {batch_chars}, {max_documents}")
    files = resolve_inputs(inputs)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(os.fspath(tokenizer))
    tokenizer_info = tokenizer_record(tokenizer, eos_token_id)
    dtype = token_dtype(tokenizer_info["vocab_size"])
    settings = {"text_field": text_field, "txt_documents": txt_documents, "shard_tokens": shard_tokens,
                "max_documents": max_documents}
    out = Path(out_dir)
    created = not out.exists()
    previous = _prepare_output(out, overwrite)
    if previous is not None:
        _check_resumable(previous, files, tokenizer_info, dtype, settings, out)
        _check_shard_files(previous, out)
    _remove_unrecorded(out, previous)
    if previous is not None and previous["complete"]:
        return previous
    manifest = previous or _fresh_manifest(files, tokenizer_info, dtype, settings)
    for record, file in zip(manifest["inputs"], files):  # inputs not read yet may have changed harmlessly
        record.update(size=file.size, fingerprint=file.fingerprint)
    start = Cursor(**manifest["shards"][-1]["end"]) if manifest["shards"] else Cursor()
    stream = DocumentStream(files, text_field, txt_documents, start)
    shards = _ShardSequence(out, manifest, stream, shard_tokens, dtype)
    limit = None if max_documents is None else max_documents - shards.documents
    try:
        last = _run(stream, limit, batch_chars, shards, tokenizer, workers, dtype, tokenizer_info["eos_token_id"],
                    progress)
        if shards.documents == 0:
            raise CorpusError(f"no documents in the inputs ({', '.join(f.path for f in files)}): every file is "
                              f"empty or holds only empty texts")
        shards.close(last or start, final=True)
    except BaseException:
        shards.abort()
        if created and not manifest["shards"]:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return manifest


def _run(stream: DocumentStream, limit: int | None, batch_chars: int, shards: _ShardSequence, tokenizer: Any,
         workers: int, dtype: np.dtype, eos: int, progress: bool) -> Cursor | None:
    """Read, tokenize (in order, a bounded number of batches in flight) and hand results to `shards`;
    the cursor after the last document, or None when there was none."""
    from tqdm.auto import tqdm

    encoder = _Encoder(tokenizer, workers, dtype, eos)
    in_flight: deque[tuple[Future, list[Cursor]]] = deque()
    batches = _batches(stream, limit, batch_chars)
    last: Cursor | None = None
    started, new_tokens = time.perf_counter(), 0
    bar = tqdm(total=limit, unit="doc", unit_scale=True, desc="tokenize",
               disable=not progress, dynamic_ncols=True)
    try:
        while True:
            while len(in_flight) < encoder.max_in_flight and (batch := next(batches, None)) is not None:
                texts, cursors = batch
                in_flight.append((encoder.submit(texts), cursors))
            if not in_flight:
                return last
            future, cursors = in_flight.popleft()
            tokens, lengths = future.result()
            shards.add(tokens, lengths, cursors)
            last = cursors[-1]
            new_tokens += tokens.size
            bar.update(len(cursors))
            bar.set_postfix_str(f"{new_tokens / max(time.perf_counter() - started, 1e-9):,.0f} tok/s", refresh=False)
    finally:
        bar.close()
        encoder.close()
