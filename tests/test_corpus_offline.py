"""The offline English corpus (on small stand-ins for the Debian packages' files), its split, the BPE
tokenizer, and the `corpus` command group."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
from pathlib import Path

import pytest

from t2mlr.corpus import (
    CorpusError,
    ShardedTokenDataset,
    prepare_offline_corpus,
    train_bpe_tokenizer,
)
from t2mlr.corpus.commands import main as corpus_main
from t2mlr.corpus.offline import gcide_entries, is_validation, iter_texts

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def base64_number(value: int) -> str:
    digits = ""
    while True:
        value, digit = divmod(value, 64)
        digits = B64[digit] + digits
        if not value:
            return digits


def fake_gcide(root: Path) -> tuple[Path, Path, list[str], str]:
    """A dictd database: a header entry, an entry with two headwords, one with a stray cp1252 byte.
    Returns the files, the texts of the good entries and the id of the bad one."""
    entries = [
        ("00-database-info", b"This file was converted from the original database.\n"),
        ("Apple", b'Apple \\Ap"ple\\, n.\n   The fleshy pome of a tree.\n   [1913 Webster]\n'),
        ("Quote", b"Quote, n.\n   The market\x92s word.\n"),
        ("Zythum", b'Zythum \\Zy"thum\\, n.\n   A kind of ancient malt beverage.\n'),
    ]
    data, index, offset, offsets = b"", [], 0, []
    for word, body in entries:
        index.append(f"{word}\t{base64_number(offset)}\t{base64_number(len(body))}")
        offsets.append(offset)
        data += body
        offset += len(body)
    first_offset, first_length = index[1].split("\t")[1:]
    index.append(f"apple\t{first_offset}\t{first_length}")  # a second headword of the same entry
    dict_path, index_path = root / "gcide.dict.dz", root / "gcide.index"
    dict_path.write_bytes(gzip.compress(data))
    index_path.write_text("\n".join(sorted(index)) + "\n", encoding="utf-8")
    return dict_path, index_path, [body.decode("utf-8").strip() for _, body in (entries[1], entries[3])], \
        f"gcide/{offsets[2]}"


def fake_python_docs(root: Path, count: int = 30) -> list[str]:
    sources = root / "python3.11" / "html" / "_sources"
    texts = []
    for i in range(count):
        folder = sources / ("library" if i % 2 else "tutorial")
        folder.mkdir(parents=True, exist_ok=True)
        text = f":mod:`m{i}` --- Module {i}\n=====\n\nThis module provides function number {i}.\n\n  >>> f({i})\n"
        (folder / f"m{i:02d}.rst.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    (root / "python3.9" / "html" / "_sources").mkdir(parents=True)  # an older version: ignored
    return texts


def test_prepare_offline_corpus_writes_every_document_once_with_a_stable_split(tmp_path: Path) -> None:
    docs_root = tmp_path / "doc"
    doc_texts = fake_python_docs(docs_root)
    dict_path, index_path, entry_texts, bad_entry = fake_gcide(tmp_path)
    summary = prepare_offline_corpus(tmp_path / "out", validation_fraction=0.25, parquet=True,
                                     python_docs_root=docs_root, gcide_dict=dict_path, gcide_index=index_path)
    records = {split: [json.loads(line) for line in (tmp_path / "out" / f"{split}.jsonl").open()]
               for split in ("train", "validation")}
    everything = records["train"] + records["validation"]
    assert sorted(r["text"] for r in everything) == sorted(doc_texts + entry_texts)
    assert {r["id"] for r in records["validation"]} == {r["id"] for r in everything if is_validation(r["id"], 0.25)}
    assert 0 < len(records["validation"]) < len(everything)
    assert summary["documents"] == len(everything) == 32
    assert summary["characters"] == sum(len(r["text"]) for r in everything)
    assert summary["skipped_not_utf8"] == [bad_entry]
    assert summary["origins"]["python-docs"] == str(docs_root / "python3.11" / "html" / "_sources")
    gcide = [r for r in everything if r["source"] == "gcide"]
    assert [r["title"] for r in gcide] == ["Apple", "Zythum"]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out" / "train.parquet").column("text").to_pylist() == [
        r["text"] for r in records["train"]]
    assert json.loads((tmp_path / "out" / "corpus.json").read_text()) == summary


def test_the_split_depends_only_on_the_document_id() -> None:
    ids = [f"doc/{i}" for i in range(4000)]
    chosen = [i for i in ids if is_validation(i, 0.1)]
    assert chosen == [i for i in ids if is_validation(i, 0.1)]
    assert 300 < len(chosen) < 500
    assert set(chosen) <= {i for i in ids if is_validation(i, 0.2)}  # a larger fraction only adds documents


def test_missing_packages_say_how_to_install_them(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="apt-get install -y python3.11-doc dict-gcide"):
        prepare_offline_corpus(tmp_path / "out", sources=["python-docs"], python_docs_root=tmp_path)
    with pytest.raises(CorpusError, match="GCIDE not found"):
        prepare_offline_corpus(tmp_path / "out", sources=["gcide"], gcide_dict=tmp_path / "none.dz")
    with pytest.raises(CorpusError, match="sources must be"):
        prepare_offline_corpus(tmp_path / "out", sources=["wikipedia"])


def test_gcide_index_entries_are_distinct_and_in_file_order(tmp_path: Path) -> None:
    _, index_path, _, _ = fake_gcide(tmp_path)
    entries = gcide_entries(index_path)
    assert [word for _, _, word in entries] == ["Apple", "Quote", "Zythum"]
    assert [offset for offset, _, _ in entries] == sorted(offset for offset, _, _ in entries)


def test_bpe_tokenizer_round_trips_text_and_has_an_eos(tmp_path: Path) -> None:
    texts = ["The quick brown fox jumps over the lazy dog.\n" * 3, "naïve café → résumé", "def f(x):\n    return x"]
    tokenizer = train_bpe_tokenizer(texts * 20, vocab_size=300, out_dir=tmp_path / "tok")
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0 and len(tokenizer) <= 300
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) < len(text.encode()) and tokenizer.decode(ids) == text
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert reloaded(texts[1])["input_ids"] == tokenizer(texts[1])["input_ids"]
    with pytest.raises(CorpusError, match="at least 257"):
        train_bpe_tokenizer(texts, vocab_size=100)


def test_the_corpus_commands_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [f"document {i}: " + "words and more words " * (i % 7 + 1) for i in range(200)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert corpus_main(["train-tokenizer", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "tok"),
                        "--vocab", "280"]) == 0
    assert corpus_main(["tokenize", str(tmp_path / "c.jsonl"), "--tokenizer", str(tmp_path / "tok"),
                        "--out", str(tmp_path / "shards"), "--workers", "0", "--shard-tokens", "500"]) == 0
    assert "200 documents" in capsys.readouterr().out
    dataset = ShardedTokenDataset(tmp_path / "shards", 16)
    assert dataset.num_documents == 200 and len(list(iter_texts(tmp_path / "c.jsonl"))) == 200
    assert corpus_main(["tokenize", str(tmp_path / "missing.jsonl"), "--tokenizer", str(tmp_path / "tok"),
                        "--out", str(tmp_path / "x")]) == 2
    assert "missing.jsonl': no such file" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/usr/share/dictd/gcide.index").is_file(), reason="dict-gcide is not installed")
def test_the_installed_gcide_index_parses() -> None:
    entries = gcide_entries()
    assert len(entries) > 100_000
    assert len({offset for offset, _, _ in entries}) == len(entries)
    assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(entries))  # distinct, non-overlapping, in order


def test_python_sources_are_one_document_per_file_in_hash_order(tmp_path: Path) -> None:
    """The source a machine without Debian's packages still has: *.py files, caches, empty files, non-UTF-8 and
    generated giants left out; the order is the hash of the path, so any prefix samples every package."""
    from t2mlr.corpus.offline import MAX_SOURCE_FILE_BYTES, python_source_documents

    root = tmp_path / "site"
    for package in ("alpha", "beta", "gamma"):
        for i in range(4):
            (root / package).mkdir(parents=True, exist_ok=True)
            (root / package / f"m{i}.py").write_text(f"def f{i}():\n    return '{package}'\n", encoding="utf-8")
    (root / "alpha" / "__pycache__").mkdir()
    (root / "alpha" / "__pycache__" / "m0.py").write_text("cached = 1\n")
    (root / "alpha" / "empty.py").write_text("  \n")
    (root / "beta" / "latin1.py").write_bytes("name = 'caf\xe9'\n".encode("latin-1"))
    (root / "gamma" / "table.py").write_text("x = 1\n" * (MAX_SOURCE_FILE_BYTES // 6 + 1))
    (root / "gamma" / "notes.txt").write_text("not python\n")
    skipped: list[str] = []
    docs = list(python_source_documents(root, skipped))
    ids = [doc["id"] for doc in docs]
    assert sorted(ids) == sorted(f"python-sources/{p}/m{i}.py" for p in ("alpha", "beta", "gamma") for i in range(4))
    assert ids != sorted(ids) and ids == sorted(ids, key=lambda i: hashlib.sha256(i.split("/", 1)[1].encode()).digest())
    assert {doc["source"] for doc in docs} == {"python-sources"} and "return 'beta'" in docs[ids.index(
        "python-sources/beta/m1.py")]["text"]
    assert skipped == ["python-sources/beta/latin1.py"]
    summary = prepare_offline_corpus(tmp_path / "out", sources=["python-sources"], python_sources_root=root)
    assert summary["documents"] == 12 and summary["origins"] == {"python-sources": str(root)}
    with pytest.raises(CorpusError, match="not a directory"):
        prepare_offline_corpus(tmp_path / "out2", sources=["python-sources"], python_sources_root=tmp_path / "none")
