"""Bad input: a CorpusError (a ValueError) naming the file, the line or row and the cause, and no partial
shard left behind."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import make_documents, make_tokenizer, write_jsonl, write_parquet

from t2mlr.corpus import CorpusError, read_manifest, resolve_inputs, tokenize_corpus

DOCS = make_documents(60, seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(DOCS)


def run(inputs, tokenizer, out: Path, **kwargs):
    return tokenize_corpus(inputs, tokenizer, out, workers=0, progress=False, **kwargs)


def assert_nothing_partial(out: Path) -> None:
    """Either no output at all, or only the shards a manifest records (which a resume continues from)."""
    if not out.exists():
        return
    names = {p.name for p in out.iterdir()}
    assert not any(name.endswith(".tmp") for name in names), names
    if "manifest.json" in names:
        manifest = read_manifest(out)
        assert not manifest["complete"]
        recorded = {"manifest.json"} | {s[k] for s in manifest["shards"] for k in ("tokens", "offsets")}
        assert names == recorded
    else:
        assert names == set(), names


def test_corpus_error_is_a_value_error() -> None:
    assert issubclass(CorpusError, ValueError)


def test_missing_text_field_names_the_field_the_file_and_what_there_is(tokenizer, tmp_path: Path) -> None:
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "fine"}\n{"body": "x", "id": 3}\n')
    with pytest.raises(CorpusError, match=r"d\.jsonl: line 2: no text field 'text'; the record's fields are \['body', 'id'\]"):
        run(jsonl, tokenizer, tmp_path / "out")
    assert_nothing_partial(tmp_path / "out")

    parquet = write_parquet(DOCS, tmp_path / "d.parquet", field="content")
    with pytest.raises(CorpusError, match=r"d\.parquet: no text column 'text'; the columns are \['id', 'content'\]"):
        run(parquet, tokenizer, tmp_path / "out")
    assert_nothing_partial(tmp_path / "out")
    assert run(parquet, tokenizer, tmp_path / "ok", text_field="content")["num_documents"] == len(DOCS)


def test_non_utf8_bytes_name_the_file_and_the_line_or_row(tokenizer, tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(b'{"text": "one"}\n\n{"text": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl: line 3: not valid UTF-8"):
        run(jsonl, tokenizer, tmp_path / "out")

    txt = tmp_path / "bad.txt"
    txt.write_bytes(b"fine line\nanother\nbroken \xff here\n")
    with pytest.raises(CorpusError, match=r"bad\.txt: line 3: not valid UTF-8"):
        run(txt, tokenizer, tmp_path / "out")
    with pytest.raises(CorpusError, match=r"bad\.txt: line 3: not valid UTF-8"):
        run(txt, tokenizer, tmp_path / "out", txt_documents="paragraph")

    values = [d.encode() for d in DOCS[:5]] + [b"bad \xc3\x28 bytes"]
    pq.write_table(pa.table({"text": pa.array(values, pa.binary())}), tmp_path / "binary.parquet")
    with pytest.raises(CorpusError, match=r"binary\.parquet: row 5 \(counting from 0\): 'text' is not valid UTF-8"):
        run(tmp_path / "binary.parquet", tokenizer, tmp_path / "out")
    as_string = pa.array(values, pa.binary()).view(pa.string())  # a string column holding invalid bytes
    pq.write_table(pa.table({"text": as_string}), tmp_path / "string.parquet", row_group_size=2)
    with pytest.raises(CorpusError, match=r"string\.parquet: row 5 \(counting from 0\): 'text' is not valid UTF-8"):
        run(tmp_path / "string.parquet", tokenizer, tmp_path / "out")
    assert_nothing_partial(tmp_path / "out")


def test_other_bad_records(tokenizer, tmp_path: Path) -> None:
    cases = {
        "json.jsonl": ('{"text": "a"}\n{"text": "b",\n', r"json\.jsonl: line 2: not valid JSON"),
        "list.jsonl": ('["text"]\n', r"list\.jsonl: line 1: expected a JSON object, got a list"),
        "number.jsonl": ('{"text": 5}\n', r"number\.jsonl: line 1: field 'text' is a int, expected a string"),
        "surrogate.jsonl": ('{"text": "emoji \\ud83d\\ude00 ok"}\n{"text": "half \\ud83d"}\n',
                            r"surrogate\.jsonl: line 2: field 'text' holds an unpaired surrogate"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(CorpusError, match=message):
            run(tmp_path / name, tokenizer, tmp_path / "out")
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "null.parquet")
    with pytest.raises(CorpusError, match=r"null\.parquet: row 1 \(counting from 0\): 'text' is null"):
        run(tmp_path / "null.parquet", tokenizer, tmp_path / "out")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(CorpusError, match=r"ints\.parquet: column 'text' has type int64, expected a string column"):
        run(tmp_path / "ints.parquet", tokenizer, tmp_path / "out")
    assert_nothing_partial(tmp_path / "out")


def test_unreadable_files(tokenizer, tmp_path: Path) -> None:
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(CorpusError, match=r"garbage\.parquet: not a readable parquet file"):
        run(tmp_path / "garbage.parquet", tokenizer, tmp_path / "out")
    (tmp_path / "plain.jsonl.gz").write_text('{"text": "not compressed"}\n')
    with pytest.raises(CorpusError, match=r"plain\.jsonl\.gz: cannot be read \(BadGzipFile"):
        run(tmp_path / "plain.jsonl.gz", tokenizer, tmp_path / "out")
    data = gzip.compress(("\n".join(json.dumps({"text": d}) for d in DOCS) + "\n").encode())
    (tmp_path / "truncated.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=r"truncated\.jsonl\.gz: cannot be read \(EOFError"):
        run(tmp_path / "truncated.jsonl.gz", tokenizer, tmp_path / "out", shard_tokens=50)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(CorpusError, match=r"dangling\.jsonl' cannot be read: it is a broken link"):
        run(tmp_path / "dangling.jsonl", tokenizer, tmp_path / "out")
    with pytest.raises(CorpusError, match=r"missing\.jsonl': no such file or directory"):
        run(tmp_path / "missing.jsonl", tokenizer, tmp_path / "out")
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(CorpusError, match=r"notes\.csv: unsupported file type; expected one of \.jsonl\.gz"):
        run(tmp_path / "notes.csv", tokenizer, tmp_path / "out")
    with pytest.raises(CorpusError, match=r"the glob '.*nothing\*\.jsonl' matches no file"):
        run(str(tmp_path / "nothing*.jsonl"), tokenizer, tmp_path / "out")
    with pytest.raises(CorpusError, match="listed twice"):
        resolve_inputs([tmp_path / "garbage.parquet", f"{tmp_path}/./garbage.parquet"])
    assert_nothing_partial(tmp_path / "out")


def test_empty_inputs(tokenizer, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n\n")
    (tmp_path / "empty_texts.jsonl").write_text('{"text": ""}\n{"text": ""}\n')
    (tmp_path / "empty.txt").write_text("")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    for name in ("empty.jsonl", "blank.jsonl", "empty_texts.jsonl", "empty.txt", "empty.parquet"):
        with pytest.raises(CorpusError, match=f"no documents in the inputs .*{name}"):
            run(tmp_path / name, tokenizer, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    with pytest.raises(CorpusError, match="no inputs given"):
        run([], tokenizer, tmp_path / "out")


def test_a_bad_record_after_finished_shards_keeps_them_and_nothing_else(tokenizer, tmp_path: Path) -> None:
    good = write_jsonl(DOCS, tmp_path / "a.jsonl")
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"text": DOCS[0]}) + "\n" + json.dumps({"txt": "oops"}) + "\n")
    with pytest.raises(CorpusError, match=r"b\.jsonl: line 2: no text field 'text'"):
        run([good, bad], tokenizer, tmp_path / "out", shard_tokens=200, batch_chars=300)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["shards"]  # finished shards are kept for a resume once b.jsonl is fixed
    assert_nothing_partial(tmp_path / "out")
    bad.write_text(json.dumps({"text": DOCS[0]}) + "\n" + json.dumps({"text": "fixed"}) + "\n")
    fixed = run([good, bad], tokenizer, tmp_path / "out", shard_tokens=200, batch_chars=300)
    assert fixed["complete"] and fixed["num_documents"] == len(DOCS) + 2


def test_an_unreachable_hub_dataset_is_named(tokenizer, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CorpusError, match=r"hub dataset 'someone/some-corpus' cannot be listed"):
        resolve_inputs("someone/some-corpus")
    with pytest.raises(CorpusError, match=r"hub dataset 'hf://datasets/someone/some-corpus/\*\.parquet' cannot be listed"):
        resolve_inputs("hf://datasets/someone/some-corpus/*.parquet")


def test_evaluation_files_of_a_hub_dataset_are_not_taken_by_accident() -> None:
    from t2mlr.corpus.sources import _looks_held_out

    assert _looks_held_out("hf://datasets/a/b/data/test-00000-of-00001.parquet")
    assert _looks_held_out("hf://datasets/a/b/validation/part.jsonl")
    assert not _looks_held_out("hf://datasets/a/b/data/train-00000-of-00004.parquet")
    assert not _looks_held_out("hf://datasets/a/b/sample/10BT/000_00000.parquet")


def test_bad_arguments_and_output_directories(tokenizer, tmp_path: Path) -> None:
    source = write_jsonl(DOCS, tmp_path / "d.jsonl")
    with pytest.raises(CorpusError, match="txt_documents must be 'file' or 'paragraph'"):
        run(source, tokenizer, tmp_path / "out", txt_documents="lines")
    with pytest.raises(CorpusError, match="need workers >= 0"):
        run(source, tokenizer, tmp_path / "out", shard_tokens=0)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.md").write_text("mine")
    with pytest.raises(CorpusError, match="holds other files"):
        run(source, tokenizer, tmp_path / "busy")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.md"]
    tokenizer_without_eos = make_tokenizer(DOCS)
    tokenizer_without_eos.eos_token = None
    with pytest.raises(CorpusError, match="no eos token"):
        run(source, tokenizer_without_eos, tmp_path / "out")
    assert run(source, tokenizer_without_eos, tmp_path / "out", eos_token_id=5)["tokenizer"]["eos_token_id"] == 5
