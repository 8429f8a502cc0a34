"""Shared pieces of the corpus tests: documents, a tiny tokenizer trained on them, input writers, and an
independent reading of the shards (plain file reads, not the library's dataset)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

WORDS = ("the of and to in is was for on that with as by at from his her an which are this be or had not but "
         "recurrence layer memory token shard corpus gradient café naïve → 日本 ünïcödé résumé").split()


def make_documents(count: int = 120, seed: int = 0) -> list[str]:
    """Texts of 1 to ~80 words over a few lines each (single newlines only, so that the same texts
    can also be written as blank-line-separated paragraphs)."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(1, 28))
            lines.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), n)))
        docs.append("\n".join(lines))
    return docs


def make_tokenizer(docs: list[str], vocab_size: int = 320) -> Any:
    from t2mlr.corpus import train_bpe_tokenizer

    return train_bpe_tokenizer(docs, vocab_size)


def reference_documents(tokenizer: Any, docs: list[str]) -> list[list[int]]:
    """Each non-empty text tokenized on its own (not batched), closed by EOS."""
    return [tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for doc in docs if doc]


def write_jsonl(docs: list[str], path: Path, field: str = "text", gz: bool = False) -> Path:
    lines = "".join(json.dumps({"id": i, field: doc}) + "\n" for i, doc in enumerate(docs))
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(lines)
    else:
        path.write_text(lines, encoding="utf-8")
    return path


def write_parquet(docs: list[str], path: Path, rows_per_group: int = 16, field: str = "text") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(docs))), field: docs})
    pq.write_table(table, path, row_group_size=rows_per_group)
    return path


def write_txt_files(docs: list[str], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (directory / f"doc_{i:04d}.txt").write_text(doc, encoding="utf-8")
    return directory


def write_txt_paragraphs(docs: list[str], path: Path) -> Path:
    path.write_text("\n\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def read_shards(directory: Path) -> tuple[list[int], list[int]]:
    """(all tokens, all document start positions) of a corpus directory, read file by file."""
    manifest = json.loads((directory / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    tokens: list[int] = []
    starts: list[int] = []
    for shard in manifest["shards"]:
        data = np.fromfile(directory / shard["tokens"], dtype=dtype)
        offsets = np.load(directory / shard["offsets"])
        assert offsets[0] == 0 and offsets[-1] == data.size
        starts.extend(int(o) + len(tokens) for o in offsets[:-1])
        tokens.extend(int(t) for t in data)
    return tokens, starts


def shard_bytes(directory: Path) -> dict[str, bytes]:
    """Every shard and offsets file's bytes, by name."""
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard_*"))}
