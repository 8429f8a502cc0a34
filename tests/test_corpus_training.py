"""The trainer streams a tokenized corpus (`data.source: shards`), with its document boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_helpers import make_documents, make_tokenizer

from t2mlr.corpus.tokenize import tokenize_corpus
from t2mlr.training import load_config, train
from t2mlr.training.data import DataError, build_dataset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_training_reads_shards_and_keeps_document_starts(tmp_path: Path) -> None:
    docs = make_documents(80)
    tokenizer = make_tokenizer(docs)
    (tmp_path / "docs.txt").write_text("\n\n".join(docs), encoding="utf-8")
    tokenize_corpus([str(tmp_path / "docs.txt")], tokenizer, tmp_path / "shards", workers=0, txt_documents="paragraph")
    overrides = [f"model.base.vocab_size={len(tokenizer)}", "data.source=shards", f"data.path={tmp_path / 'shards'}",
                 "data.kwargs={}", "data.seq_len=32", "eval.every=0", "train.max_steps=3", "logging.progress_bar=false",
                 "checkpoint.every=0", "checkpoint.save_final=false"]
    cfg = load_config("debug", overrides)
    rows = build_dataset(cfg.data, vocab_size=len(tokenizer))
    starts = sum(int((rows[i]["position_ids"] == 0).sum()) for i in range(len(rows)))
    assert starts > len(rows)  # documents start inside rows, not only at row starts
    result = train(cfg, tmp_path / "run")
    assert result.step == 3 and all(loss > 0 for loss in result.losses)


def test_a_missing_shard_directory_is_a_data_error(tmp_path: Path) -> None:
    cfg = load_config("debug", ["data.source=shards", f"data.path={tmp_path / 'none'}", "data.kwargs={}"])
    with pytest.raises(DataError, match="data.path"):
        build_dataset(cfg.data)
