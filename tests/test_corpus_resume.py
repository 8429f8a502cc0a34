"""Interrupted tokenizations resume to the bytes of an uninterrupted run: simulated crashes at every
commit step and in the middle of reading, and a real kill -9 of a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from corpus_helpers import (
    make_documents,
    make_tokenizer,
    shard_bytes,
    write_jsonl,
    write_parquet,
)

import t2mlr.corpus.shards as shards_module
from t2mlr.corpus import CorpusError, read_manifest, tokenize_corpus
from t2mlr.corpus.sources import DocumentStream

DOCS = make_documents(150, seed=1)
SETTINGS = {"shard_tokens": 350, "progress": False}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(DOCS)


@pytest.fixture(scope="module")
def reference(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("reference")
    sources = [write_jsonl(DOCS[:70], root / "a.jsonl"), write_parquet(DOCS[70:], root / "b.parquet", 16)]
    tokenize_corpus(sources, tokenizer, root / "out", workers=0, **SETTINGS)
    return root, shard_bytes(root / "out")


class Crash(RuntimeError):
    """Stands for the process dying at this point."""


def leftovers(out: Path) -> list[str]:
    """Files in `out` that the manifest does not record."""
    manifest = read_manifest(out)
    recorded = {"manifest.json"} | {s[k] for s in manifest["shards"] for k in ("tokens", "offsets")}
    return sorted(p.name for p in out.iterdir() if p.name not in recorded)


@pytest.mark.parametrize("crash_at", [1, 2, 3, 4, 7, 12, 19])
def test_crash_at_any_commit_step_resumes_to_the_same_bytes(tokenizer, reference, tmp_path, monkeypatch, crash_at):
    """os.replace runs three times per shard (offsets, tokens, manifest): crashing before the n-th call
    covers a shard renamed but not yet recorded, and a manifest not yet replaced."""
    root, expected = reference
    real_replace, calls = os.replace, []

    def crashing_replace(src, dst):
        calls.append(dst)
        if len(calls) == crash_at:
            raise Crash(f"crash before renaming to {dst}")
        real_replace(src, dst)

    monkeypatch.setattr(shards_module.os, "replace", crashing_replace)
    sources = [root / "a.jsonl", root / "b.parquet"]
    with pytest.raises(Crash):
        tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, **SETTINGS)
    monkeypatch.setattr(shards_module.os, "replace", real_replace)
    if (tmp_path / "out" / "manifest.json").exists():
        assert not read_manifest(tmp_path / "out")["complete"]
    tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, **SETTINGS)
    assert shard_bytes(tmp_path / "out") == expected
    assert leftovers(tmp_path / "out") == []


@pytest.mark.parametrize(("stop_after", "workers"), [(1, 0), (30, 0), (69, 0), (70, 0), (71, 2), (100, 0), (120, 2)])
def test_stopping_mid_stream_resumes_to_the_same_bytes(tokenizer, reference, tmp_path, monkeypatch, stop_after,
                                                       workers):
    """An error after `stop_after` documents (inside the first file, at its end, inside the second, where
    100 and 120 leave the last finished shard inside a parquet row group of 16 rows, at rows 27 and 45);
    the half-written shard is deleted, finished ones are kept and resumed from."""
    root, expected = reference
    real_iter = DocumentStream.__iter__

    def stopping_iter(self):
        for count, item in enumerate(real_iter(self)):
            if count == stop_after:
                raise Crash("stop")
            yield item

    monkeypatch.setattr(DocumentStream, "__iter__", stopping_iter)
    sources = [root / "a.jsonl", root / "b.parquet"]
    with pytest.raises(Crash):
        tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=workers, batch_chars=500, **SETTINGS)
    monkeypatch.setattr(DocumentStream, "__iter__", real_iter)
    out = tmp_path / "out"
    if out.exists():
        assert leftovers(out) == []  # nothing half-written
        done = read_manifest(out)["num_documents"]
        assert not read_manifest(out)["complete"] and done <= stop_after
    # a kill -9 leaves temp files behind: the resume must not trip over (or keep) them
    out.mkdir(exist_ok=True)
    (out / "shard_00003.bin.tmp").write_bytes(b"\x00" * 10)
    (out / "shard_00099.offsets.npy").write_bytes(b"junk")
    tokenize_corpus(sources, tokenizer, out, workers=workers, **SETTINGS)
    assert shard_bytes(out) == expected
    assert leftovers(out) == []


def test_resume_refuses_other_settings_or_changed_inputs(tokenizer, reference, tmp_path, monkeypatch) -> None:
    root, expected = reference
    sources = [write_jsonl(DOCS[:70], tmp_path / "a.jsonl"), root / "b.parquet"]
    real_iter = DocumentStream.__iter__

    def stopping_iter(self):
        for count, item in enumerate(real_iter(self)):
            if count == 60:
                raise Crash("stop")
            yield item

    monkeypatch.setattr(DocumentStream, "__iter__", stopping_iter)
    with pytest.raises(Crash):
        tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, batch_chars=500, **SETTINGS)
    monkeypatch.setattr(DocumentStream, "__iter__", real_iter)
    assert read_manifest(tmp_path / "out")["shards"]

    with pytest.raises(CorpusError, match="shard_tokens"):
        tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, shard_tokens=999, progress=False)
    with pytest.raises(CorpusError, match="inputs"):
        tokenize_corpus(sources[:1], tokenizer, tmp_path / "out", workers=0, **SETTINGS)
    other = make_tokenizer(DOCS, vocab_size=300)
    with pytest.raises(CorpusError, match="tokenizer"):
        tokenize_corpus(sources, other, tmp_path / "out", workers=0, **SETTINGS)
    write_jsonl(DOCS[:69], sources[0])  # the file already partly tokenized changes
    with pytest.raises(CorpusError, match="a.jsonl changed"):
        tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, **SETTINGS)
    write_jsonl(DOCS[:70], sources[0])
    tokenize_corpus(sources, tokenizer, tmp_path / "out", workers=0, overwrite=True, **SETTINGS)
    assert shard_bytes(tmp_path / "out") == expected


KILL_SCRIPT = textwrap.dedent("""
    import sys
    from transformers import PreTrainedTokenizerFast
    from t2mlr.corpus import tokenize_corpus
    source, tokenizer_dir, out = sys.argv[1:4]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    print("started", flush=True)
    tokenize_corpus(source, tokenizer, out, workers=1, shard_tokens=1000, batch_chars=2000, progress=False)
    print("finished", flush=True)
""")


def processes_in_group(group: int) -> list[int]:
    """Live pids whose process group is `group` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc to find the worker processes")
def test_kill_9_of_a_real_run_resumes_to_the_same_bytes(tokenizer, tmp_path: Path) -> None:
    docs = make_documents(4000, seed=2)
    source = write_jsonl(docs, tmp_path / "big.jsonl")
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    tokenize_corpus(source, tokenizer, tmp_path / "reference", workers=0, shard_tokens=1000, progress=False)
    expected = shard_bytes(tmp_path / "reference")

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(source), str(tmp_path / "tok"), str(out)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            manifest = out / "manifest.json"
            if manifest.exists() and len(read_manifest(out)["shards"]) >= 20:
                break
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()
        os.kill(process.pid, signal.SIGKILL)  # the main process only, as a crash or OOM kill would
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while processes_in_group(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_in_group(process.pid) == [], "the worker outlived its killed parent"
    finally:
        if processes_in_group(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
    killed_at = read_manifest(out)
    assert not killed_at["complete"] and 20 <= len(killed_at["shards"]) < len(expected) // 2

    tokenize_corpus(source, tokenizer, out, workers=0, shard_tokens=1000, batch_chars=2000, progress=False)
    assert shard_bytes(out) == expected
    assert read_manifest(out)["num_documents"] == len(docs)
