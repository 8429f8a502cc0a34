"""ShardedTokenDataset gives exactly the trainer's packed rows (t2mlr.training.data.pack_documents over the
same documents), with rows running across document and shard boundaries."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_helpers import (
    make_documents,
    make_tokenizer,
    reference_documents,
    write_jsonl,
)

from t2mlr.corpus import CorpusError, ShardedTokenDataset, tokenize_corpus
from t2mlr.corpus.shards import MANIFEST
from t2mlr.training.data import pack_documents

DOCS = make_documents(90, seed=4)
# A text containing the EOS string: the tokenizer maps it to the EOS id inside the document, and the
# dataset must still treat it as one document (boundaries come from the index, not from EOS tokens).
DOCS[10] = "before <|endoftext|> after the eos string"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("corpus")
    tokenizer = make_tokenizer(DOCS)
    tokenize_corpus(write_jsonl(DOCS, root / "d.jsonl"), tokenizer, root / "out", workers=0, shard_tokens=150,
                    progress=False)
    return root / "out", reference_documents(tokenizer, DOCS), tokenizer


@pytest.mark.parametrize("seq_len", [1, 7, 64, 150, 401])
def test_rows_match_the_packed_reference(corpus, seq_len: int) -> None:
    out, documents, _ = corpus
    dataset = ShardedTokenDataset(out, seq_len)
    reference = pack_documents(documents, seq_len)
    assert len(dataset) == len(reference) == sum(map(len, documents)) // seq_len
    for index in range(len(reference)):
        ours, theirs = dataset[index], reference[index]
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert ours[key].dtype == torch.int64
            assert torch.equal(ours[key], theirs[key].long()), (index, key)


def test_rows_do_cross_shard_and_document_boundaries(corpus) -> None:
    out, documents, tokenizer = corpus
    dataset = ShardedTokenDataset(out, 64)
    shard_ends = np.cumsum([s["num_tokens"] for s in dataset.manifest["shards"]])
    assert len(shard_ends) > 10
    crossing = [i for i in range(len(dataset)) if any(i * 64 < end < (i + 1) * 64 for end in shard_ends)]
    assert crossing, "no row spans two shards: the test would not exercise the join"
    # the document holding the EOS string: one document start at its first token, none at the inner EOS
    start = sum(map(len, documents[:10]))
    inner_eos = start + documents[10].index(tokenizer.eos_token_id)
    assert inner_eos < start + len(documents[10]) - 1
    row, column = divmod(inner_eos, 50)
    assert 0 < column < 49
    item = ShardedTokenDataset(out, 50)[row]
    assert item["input_ids"][column] == tokenizer.eos_token_id
    assert item["position_ids"][column + 1] == item["position_ids"][column] + 1 and item["labels"][column + 1] >= 0


def test_the_dataset_pickles_without_its_memory_maps(corpus) -> None:
    out, _, _ = corpus
    dataset = ShardedTokenDataset(out, 32)
    first = dataset[5]
    assert dataset._maps  # opened lazily by the access above
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._maps == {}
    assert all(torch.equal(first[key], clone[5][key]) for key in first)
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_an_incomplete_or_too_small_corpus_is_refused(corpus, tmp_path: Path) -> None:
    out, documents, _ = corpus
    with pytest.raises(CorpusError, match="fewer than one row"):
        ShardedTokenDataset(out, sum(map(len, documents)) + 1)
    text = (out / MANIFEST).read_text()
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / MANIFEST).write_text(text.replace('"complete": true', '"complete": false'))
    with pytest.raises(CorpusError, match="not complete"):
        ShardedTokenDataset(incomplete, 8)
    with pytest.raises(CorpusError, match="no manifest.json"):
        ShardedTokenDataset(tmp_path, 8)


def test_rows_batch_through_the_trainer_collator(corpus) -> None:
    from torch.utils.data import DataLoader

    from t2mlr.training.data import Collator

    out, _, _ = corpus
    dataset = ShardedTokenDataset(out, 32)
    batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=Collator())))
    assert batch["input_ids"].shape == (4, 32) and "attention_mask" not in batch
    assert torch.equal(batch["position_ids"][2], dataset[2]["position_ids"])
    inside = batch["position_ids"] != 0
    assert torch.equal(batch["labels"][inside], batch["input_ids"][inside]) and (batch["labels"][~inside] == -100).all()
