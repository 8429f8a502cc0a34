"""Training data: packing with document boundaries, collation (padding, transduction labels), sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from t2mlr.training.config import DataConfig
from t2mlr.training.synthetic import SyntheticChainDataset
from t2mlr.training.data import (
    IGNORE_INDEX,
    Collator,
    ResumableBatchSampler,
    build_dataset,
    count_targets,
    pack_documents,
    positions_within_documents,
    shift_aligned_labels,
)


def test_packing_restarts_positions_per_document_and_row() -> None:
    data = pack_documents([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]], seq_len=4)
    assert len(data) == 2  # 11 tokens → 2 rows of 4, the partial row is dropped
    row0, row1 = data[0], data[1]
    assert row0["input_ids"].tolist() == [1, 2, 3, 4]
    assert row0["position_ids"].tolist() == [0, 1, 2, 0]
    assert row0["labels"].tolist() == [IGNORE_INDEX, 2, 3, IGNORE_INDEX]
    # document [4, 5] is cut by the row boundary: its tail starts the next row as a new document
    assert row1["input_ids"].tolist() == [5, 6, 7, 8]
    assert row1["position_ids"].tolist() == [0, 0, 1, 2]
    assert row1["labels"].tolist() == [IGNORE_INDEX, IGNORE_INDEX, 7, 8]


def test_positions_from_starts() -> None:
    starts = torch.tensor([True, False, False, True, False, True])
    assert positions_within_documents(starts).tolist() == [0, 1, 2, 0, 1, 0]


def test_jsonl_ids_and_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, "a": 1, "b": 2, "c": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    lines = [{"input_ids": [3, 2, 1]}, {"text": "a b c a"}, {"text": "c c"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = DataConfig(source="jsonl", path=str(tmp_path / "d.jsonl"), tokenizer=str(tmp_path / "tokenizer.json"),
                     seq_len=5, eos_token_id=0)
    data = build_dataset(cfg)
    stream = torch.cat([data[i]["input_ids"] for i in range(len(data))]).tolist()
    assert stream == [3, 2, 1, 1, 2, 3, 1, 0, 3, 3][: len(data) * 5]
    assert data[0]["position_ids"].tolist() == [0, 1, 2, 0, 1]


def test_collator_shifts_transduction_labels() -> None:
    item = {"input_ids": torch.tensor([5, 6, 7, 8]), "labels": torch.tensor([IGNORE_INDEX, 1, 2, 3])}
    batch = Collator(labels_aligned_to_inputs=True)([item])
    # the model scores logits[t] against labels[t + 1], so aligned target for t moves to t + 1
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, IGNORE_INDEX, 1, 2]
    assert shift_aligned_labels(torch.tensor([4, 5])).tolist() == [IGNORE_INDEX, 4]
    assert "attention_mask" not in batch


def test_collator_pads_right_and_masks() -> None:
    items = [{"input_ids": torch.tensor([1, 2, 3])}, {"input_ids": torch.tensor([4])}]
    batch = Collator(pad_token_id=9)(items)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["labels"].tolist() == [[1, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert count_targets(batch) == 2


def test_sampler_ranks_partition_the_single_process_stream() -> None:
    single = ResumableBatchSampler(50, global_batch_size=8, micro_batch_size=4, seed=3)
    ranks = [ResumableBatchSampler(50, 8, 2, seed=3, rank=r, world_size=2) for r in range(2)]
    for step in range(10):
        for micro in range(2):
            joint = ranks[0].micro_batch(step, micro) + ranks[1].micro_batch(step, micro)
            assert joint == single.micro_batch(step, micro)


def test_sampler_resumes_mid_stream_and_covers_each_epoch() -> None:
    full = iter(ResumableBatchSampler(12, 4, 2, seed=1))
    stream = [next(full) for _ in range(12)]  # 6 steps × 2 micro-batches
    resumed = iter(ResumableBatchSampler(12, 4, 2, seed=1, start_step=3))
    assert [next(resumed) for _ in range(6)] == stream[6:]
    first_epoch = sorted(i for mb in stream[:6] for i in mb)
    assert first_epoch == list(range(12))


def test_synthetic_rows_are_deterministic_and_learnable_rule() -> None:
    a = SyntheticChainDataset(4, 32, vocab_size=16, seed=0)
    b = SyntheticChainDataset(4, 32, vocab_size=16, seed=0)
    assert torch.equal(a[2]["input_ids"], b[2]["input_ids"])
    row = a[1]
    ids, pos = row["input_ids"], row["position_ids"]
    for t in range(1, 32):
        if pos[t] > 0:
            assert ids[t] == int(a.successor[ids[t - 1]])


def test_factory_source_passes_seq_len(tmp_path: Path) -> None:
    cfg = DataConfig(source="factory", factory="t2mlr.training.synthetic:SyntheticChainDataset", seq_len=12,
                     kwargs={"num_samples": 3, "vocab_size": 8})
    data = build_dataset(cfg)
    assert len(data) == 3 and data[0]["input_ids"].shape == (12,)
    with pytest.raises(ValueError, match="cannot be imported"):
        build_dataset(DataConfig(source="factory", factory="no.such:thing"))
