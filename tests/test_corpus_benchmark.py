"""benchmarks/tokenize_throughput.py runs end to end at toy sizes (its figures come from full-size runs)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from corpus_helpers import make_documents, make_tokenizer

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def small_corpus(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the script sets it; keep it local to this test
    threads = torch.get_num_threads()
    docs = make_documents(300, seed=5)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    make_tokenizer(docs).save_pretrained(str(tmp_path / "tok"))
    yield corpus, tmp_path / "tok"
    torch.set_num_threads(threads)


def test_throughput_table(small_corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus, tokenizer = small_corpus
    load_script("tokenize_throughput").main([
        "--corpus", str(corpus), "--tokenizer", str(tokenizer), "--mb", "0.01", "--repeats", "2",
        "--workers", "1,2", "--batch-chars", "2000", "--work", str(tmp_path / "work")])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| workers")]
    assert [row[0] for row in rows] == ["1", "2"]
    for row in rows:
        assert float(row[2].replace(",", "")) > 0 and float(row[3].replace(",", "")) > 0 and float(row[4]) > 0


def test_memory_helpers_stream_a_parquet_file(small_corpus, tmp_path: Path) -> None:
    corpus, tokenizer = small_corpus
    script = load_script("tokenize_throughput")
    texts = script.first_texts(corpus, 1.0)
    path = tmp_path / "big.parquet"
    rows = script.write_big_parquet(path, texts, 0.0002, rows_per_group=500)
    assert path.stat().st_size >= 0.0002e9 and rows % 500 == 0
    read = script.measure("read", path, tokenizer, tmp_path / "out", 1, 0)
    assert read["documents"] == rows and read["peak_rss_mib"] >= read["rss_after_imports_mib"] > 0
    tokenized = script.measure("tokenize", path, tokenizer, tmp_path / "out", 700, 1)
    assert tokenized["documents"] == 700 and tokenized["tokens"] > 700 and tokenized["peak_child_rss_mib"] >= 0
