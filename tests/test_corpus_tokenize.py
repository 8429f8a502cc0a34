"""tokenize_corpus: shard contents against a document-by-document reference, the same bytes from every
input format and worker count, manifest bookkeeping."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import (
    make_documents,
    make_tokenizer,
    read_shards,
    reference_documents,
    shard_bytes,
    write_jsonl,
    write_parquet,
    write_txt_files,
    write_txt_paragraphs,
)

from t2mlr.corpus import read_manifest, tokenize_corpus
from t2mlr.corpus.shards import token_dtype

DOCS = make_documents()


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(DOCS)


def test_shards_hold_every_document_followed_by_eos(tokenizer, tmp_path: Path) -> None:
    source = write_jsonl(DOCS, tmp_path / "docs.jsonl")
    manifest = tokenize_corpus(source, tokenizer, tmp_path / "out", workers=0, shard_tokens=400, progress=False)

    expected = reference_documents(tokenizer, DOCS)
    tokens, starts = read_shards(tmp_path / "out")
    assert tokens == [t for doc in expected for t in doc]
    assert starts == list(np.cumsum([0] + [len(doc) for doc in expected])[:-1])
    assert manifest == read_manifest(tmp_path / "out")
    assert manifest["complete"] and manifest["dtype"] == "uint16"
    assert manifest["num_documents"] == len(DOCS) and manifest["num_tokens"] == len(tokens)
    assert manifest["tokenizer"]["eos_token_id"] == tokenizer.eos_token_id
    assert manifest["tokenizer"]["vocab_size"] == len(tokenizer)
    # A shard closes after the document that brings it to shard_tokens; only the last may stay short.
    counts = [shard["num_tokens"] for shard in manifest["shards"]]
    assert len(counts) > 3 and all(400 <= c < 400 + max(map(len, expected)) for c in counts[:-1])
    first = 0
    for shard in manifest["shards"]:
        path = tmp_path / "out" / shard["tokens"]
        assert shard["bytes"] == path.stat().st_size == 2 * shard["num_tokens"]
        assert shard["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert shard["offsets_sha256"] == hashlib.sha256((tmp_path / "out" / shard["offsets"]).read_bytes()).hexdigest()
        assert shard["first_document"] == first
        first += shard["num_documents"]
    (record,) = manifest["inputs"]
    assert record["status"] == "read" and record["documents"] == len(DOCS) and record["position"] == source.stat().st_size
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["manifest.json"] + [s["tokens"] for s in manifest["shards"]] + [s["offsets"] for s in manifest["shards"]])


def test_every_input_format_gives_the_same_shards(tokenizer, tmp_path: Path) -> None:
    inputs = {
        "jsonl": write_jsonl(DOCS, tmp_path / "docs.jsonl"),
        "jsonl.gz": write_jsonl(DOCS, tmp_path / "docs.jsonl.gz", gz=True),
        "parquet": write_parquet(DOCS, tmp_path / "docs.parquet", rows_per_group=7),
        "txt files": write_txt_files(DOCS, tmp_path / "txt"),
    }
    outputs = {}
    for name, source in inputs.items():
        tokenize_corpus(source, tokenizer, tmp_path / name, workers=0, shard_tokens=300, progress=False)
        outputs[name] = shard_bytes(tmp_path / name)
    paragraphs = write_txt_paragraphs(DOCS, tmp_path / "paragraphs.txt")
    tokenize_corpus(paragraphs, tokenizer, tmp_path / "par", workers=0, shard_tokens=300, txt_documents="paragraph",
                    progress=False)
    outputs["txt paragraphs"] = shard_bytes(tmp_path / "par")
    reference = outputs.pop("jsonl")
    assert len(reference) >= 8
    for name, files in outputs.items():
        assert files == reference, name


def test_worker_count_and_batch_size_do_not_change_the_bytes(tokenizer, tmp_path: Path) -> None:
    source = write_parquet(DOCS, tmp_path / "docs.parquet", rows_per_group=10)
    tokenize_corpus(source, tokenizer, tmp_path / "serial", workers=0, shard_tokens=250, progress=False)
    tokenize_corpus(source, tokenizer, tmp_path / "two", workers=2, shard_tokens=250, batch_chars=300, progress=False)
    assert shard_bytes(tmp_path / "two") == shard_bytes(tmp_path / "serial")


def test_lists_globs_and_directories_are_read_in_order(tokenizer, tmp_path: Path) -> None:
    parts = [DOCS[:40], DOCS[40:41], DOCS[41:]]
    data = tmp_path / "data"
    data.mkdir()
    paths = [write_jsonl(part, data / f"part{i}.jsonl") for i, part in enumerate(parts)]
    (data / ".ipynb_checkpoints").mkdir()
    write_jsonl(parts[0], data / ".ipynb_checkpoints" / "part0-checkpoint.jsonl")  # hidden: not an input
    whole = write_jsonl(DOCS, tmp_path / "whole.jsonl")
    tokenize_corpus(whole, tokenizer, tmp_path / "one", workers=0, shard_tokens=300, progress=False)
    runs = {"list": paths, "glob": str(data / "part*.jsonl"), "directory": data}
    for name, inputs in runs.items():
        manifest = tokenize_corpus(inputs, tokenizer, tmp_path / name, workers=0, shard_tokens=300, progress=False)
        assert shard_bytes(tmp_path / name) == shard_bytes(tmp_path / "one"), name
        assert [r["path"] for r in manifest["inputs"]] == [str(p) for p in paths]
        assert [r["documents"] for r in manifest["inputs"]] == [40, 1, len(DOCS) - 41]
    mixed = [paths[0], write_parquet(DOCS[40:], tmp_path / "rest.parquet")]
    tokenize_corpus(mixed, tokenizer, tmp_path / "mixed", workers=0, shard_tokens=300, progress=False)
    assert shard_bytes(tmp_path / "mixed") == shard_bytes(tmp_path / "one")


def test_empty_texts_are_skipped_and_counted_and_max_documents_stops(tokenizer, tmp_path: Path) -> None:
    docs = ["", DOCS[0], "", "", DOCS[1], DOCS[2], ""]
    manifest = tokenize_corpus(write_jsonl(docs, tmp_path / "d.jsonl"), tokenizer, tmp_path / "out", workers=0,
                               progress=False)
    tokens, starts = read_shards(tmp_path / "out")
    assert tokens == [t for doc in reference_documents(tokenizer, docs) for t in doc] and len(starts) == 3
    assert manifest["inputs"][0]["skipped_empty"] == 4 and manifest["inputs"][0]["documents"] == 3

    limited = tokenize_corpus(write_parquet(DOCS, tmp_path / "d.parquet"), tokenizer, tmp_path / "limited",
                              workers=0, max_documents=25, shard_tokens=200, progress=False)
    tokens, _ = read_shards(tmp_path / "limited")
    assert limited["num_documents"] == 25 and limited["complete"]
    assert tokens == [t for doc in reference_documents(tokenizer, DOCS[:25]) for t in doc]
    assert limited["inputs"][0]["status"] == "partial" and limited["inputs"][0]["position"] == 25


def test_wide_vocabularies_get_uint32_tokens(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(70_000)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="w69999")
    docs = ["w1 w65535 w65536", "w69998 w3"]
    manifest = tokenize_corpus(write_jsonl(docs, tmp_path / "d.jsonl"), tokenizer, tmp_path / "out", workers=0,
                               progress=False)
    assert manifest["dtype"] == "uint32"
    assert read_shards(tmp_path / "out")[0] == [1, 65535, 65536, 69999, 69998, 3, 69999]
    assert token_dtype(2**16) == np.uint16 and token_dtype(2**16 + 1) == np.uint32


def test_a_finished_corpus_is_left_alone(tokenizer, tmp_path: Path) -> None:
    source = write_jsonl(DOCS, tmp_path / "d.jsonl")
    first = tokenize_corpus(source, tokenizer, tmp_path / "out", workers=0, shard_tokens=500, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    again = tokenize_corpus(source, tokenizer, tmp_path / "out", workers=0, shard_tokens=500, progress=False)
    assert again == first
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == stamps
    json.loads((tmp_path / "out" / "manifest.json").read_text())  # still valid JSON


def test_data_tokenize_and_corpus_tokenize_are_one_command(tokenizer, tmp_path: Path) -> None:
    """`t2mlr data tokenize` (the issue's spelling) and `t2mlr corpus tokenize` run one handler and write
    the same shards as the library call; the data group gathers it without importing the corpus part."""
    from t2mlr.cli import build_parser
    from t2mlr.cli import main as cli_main

    tokenizer.save_pretrained(str(tmp_path / "tok"))
    source = write_parquet(DOCS, tmp_path / "docs.parquet")
    for group in ("data", "corpus"):
        argv = [group, "tokenize", str(source), "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / group),
                "--workers", "0", "--shard-tokens", "500"]
        assert cli_main(argv) == 0
    tokenize_corpus(source, tokenizer, tmp_path / "library", workers=0, shard_tokens=500, progress=False)
    assert shard_bytes(tmp_path / "data") == shard_bytes(tmp_path / "corpus") == shard_bytes(tmp_path / "library")
    parser = build_parser()
    handlers = {parser.parse_args([group, "tokenize", "x", "--tokenizer", "t", "--out", "o"]).func
                for group in ("data", "corpus")}
    assert len(handlers) == 1
