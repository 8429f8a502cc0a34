"""Bad training data fail early and clearly: a DataError naming the file, the 1-based line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from t2mlr.training.config import DataConfig
from t2mlr.training.data import (
    DataError,
    build_dataset,
    check_token_range,
    read_jsonl_documents,
)
from t2mlr.training.synthetic import SyntheticChainDataset


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _config(path: Path, **kwargs) -> DataConfig:
    return DataConfig(source="jsonl", path=str(path), seq_len=2, **kwargs)


def _error(path: Path, vocab_size: int | None = None, **kwargs) -> DataError:
    with pytest.raises(DataError) as caught:
        build_dataset(_config(path, **kwargs), vocab_size=vocab_size)
    return caught.value


def _word_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<eos>": 0, "a": 1, "b": 2}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


# ------------------------------------------------------------------------------------ files


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    err = _error(missing)
    assert str(missing) in str(err) and "no such data file" in str(err) and err.path == str(missing)
    assert isinstance(err, ValueError)  # callers that catch bad input as ValueError keep working
    with pytest.raises(DataError, match="nowhere.jsonl"):
        read_jsonl_documents(missing, None)  # fails on the call, not on the first document
    with pytest.raises(DataError, match="data.path is not set"):
        build_dataset(DataConfig(source="jsonl", path=None))


def test_an_empty_file_and_a_file_of_blank_lines(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = _error(empty)
    assert str(empty) in str(err) and "empty" in str(err)
    blank = _jsonl(tmp_path / "blank.jsonl", ["", "   ", "\t"])
    err = _error(blank)
    assert str(blank) in str(err) and "only blank lines" in str(err)


def test_documents_that_are_all_empty_name_the_file(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": []}', '{"input_ids": []}'])
    err = _error(path)
    assert str(path) in str(err) and "no non-empty documents" in str(err)
    short = _jsonl(tmp_path / "short.jsonl", ['{"input_ids": [1]}'])
    assert "not enough for one sequence of 2" in str(_error(short)) and str(short) in str(_error(short))


# ------------------------------------------------------------------------------------ lines


def test_malformed_json_names_the_file_and_its_real_line(tmp_path: Path) -> None:
    # line 3 is blank and counts; the broken object is on line 4 (1-based), not "line 2" of a json fragment
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [1, 2]}', '{"input_ids": [3]}', "", '{"input_ids": [4,'])
    err = _error(path)
    assert str(err) == f"{path}:4: invalid JSON at column 18: Expecting value"  # just past '{"input_ids": [4,'
    assert (err.path, err.line) == (str(path), 4)


def test_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [1, 2]}', "[1, 2, 3]"])
    assert str(_error(path)) == f"{path}:2: expected a JSON object, got list"


def test_a_line_without_either_field_names_both(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [1, 2]}', '{"tokens": [1]}'])
    message = str(_error(path, ids_field="input_ids", text_field="text"))
    assert message.startswith(f"{path}:2:") and "'input_ids'" in message and "'text'" in message
    assert "'tokens'" in message  # what the line has instead
    custom = str(_error(path, ids_field="ids", text_field="body"))
    assert custom.startswith(f"{path}:1:") and "'ids'" in custom and "'body'" in custom


@pytest.mark.parametrize("ids, detail", [
    ('["3", 4]', "item 0 is '3'"),
    ("[1, 2.5]", "item 1 is 2.5"),
    ("[1, true]", "item 1 is True"),
    ("[1, [2]]", "item 1 is [2]"),
    ('"1 2 3"', "must be a list of integer token ids, got str"),
    ("7", "must be a list of integer token ids, got int"),
])
def test_ids_that_are_not_integers(tmp_path: Path, ids: str, detail: str) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [5, 6]}', "", f'{{"input_ids": {ids}}}'])
    message = str(_error(path))
    assert message.startswith(f"{path}:3: field 'input_ids'") and detail in message


@pytest.mark.parametrize("bad_id, index", [(10, 2), (-1, 0), (10**6, 1)])
def test_ids_outside_the_vocabulary_name_file_line_and_range(tmp_path: Path, bad_id: int, index: int) -> None:
    ids = [1, 2, 3]
    ids[index] = bad_id
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [0, 9]}', json.dumps({"input_ids": ids})])
    message = str(_error(path, vocab_size=10))
    assert message.startswith(f"{path}:2: field 'input_ids': item {index} is token id {bad_id}")
    assert "[0, 10)" in message
    if bad_id >= 0:  # the same line passes once the vocabulary holds the id
        assert len(build_dataset(_config(path), vocab_size=bad_id + 1)) == 2


def test_negative_ids_fail_even_without_a_vocabulary_size(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [3, -2]}'])
    assert str(_error(path)).startswith(f"{path}:1: field 'input_ids': item 1 is token id -2")


def test_the_largest_id_in_range_is_accepted(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [0, 9, 9, 0]}'])
    data = build_dataset(_config(path), vocab_size=10)
    assert data[1]["input_ids"].tolist() == [9, 0]


def test_a_text_line_without_a_tokenizer(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [1, 2]}', '{"text": "a b"}'])
    message = str(_error(path))
    assert message.startswith(f"{path}:2: field 'text' holds text but no tokenizer") and "data.tokenizer" in message


def test_text_whose_tokens_or_eos_fall_outside_the_vocabulary(tmp_path: Path) -> None:
    tokenizer = _word_tokenizer(tmp_path)
    path = _jsonl(tmp_path / "d.jsonl", ['{"text": "a a"}', '{"text": "b a"}'])
    # the tokenizer's id 2 ("b") is past a 2-token model vocabulary: line 2, not line 1
    message = str(_error(path, vocab_size=2, tokenizer=str(tokenizer), eos_token_id=0))
    assert message.startswith(f"{path}:2: the tokenizer's ids for field 'text': item 0 is token id 2")
    assert "[0, 2)" in message
    eos = str(_error(path, vocab_size=3, tokenizer=str(tokenizer), eos_token_id=5))
    assert "eos_token_id = 5" in eos and "[0, 3)" in eos
    with pytest.raises(DataError, match="data.tokenizer"):
        build_dataset(_config(path, tokenizer=str(tmp_path / "no_tokenizer_here")))


def test_the_pad_id_must_be_in_the_vocabulary(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", ['{"input_ids": [1, 2]}'])
    assert "data.pad_token_id = 12" in str(_error(path, vocab_size=10, pad_token_id=12))


# ------------------------------------------------------------------------------------ datasets


class _RowsWithOneBadId(Dataset):
    """Row `bad_row` holds `bad_id` at position 1 of its labels; every other id is small."""

    def __init__(self, rows: int, bad_row: int, bad_id: int) -> None:
        self.rows, self.bad_row, self.bad_id = rows, bad_row, bad_id
        self.visited: list[int] = []

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.visited.append(index)
        labels = torch.tensor([-100, 1, 2])
        if index == self.bad_row:
            labels[1] = self.bad_id
        return {"input_ids": torch.tensor([1, 2, 3]), "labels": labels}


def test_check_token_range_on_rows_made_on_demand() -> None:
    data = _RowsWithOneBadId(rows=1000, bad_row=999, bad_id=50)
    with pytest.raises(DataError) as caught:
        check_token_range(data, vocab_size=50, sample_rows=4)  # the last row is always among the sampled
    assert str(caught.value) == "data: row 999, labels: token id 50 is outside the model's vocabulary [0, 50)"
    assert data.visited == [0, 333, 666, 999]
    check_token_range(_RowsWithOneBadId(1000, 999, -100), vocab_size=50, sample_rows=4)  # -100: ignored label
    middle = _RowsWithOneBadId(rows=10, bad_row=5, bad_id=-7)
    with pytest.raises(DataError, match="row 5, labels: token id -7"):
        check_token_range(middle, vocab_size=50, sample_rows=100)  # more samples than rows: every row
    assert sorted(middle.visited) == list(range(6))


def test_a_synthetic_vocabulary_larger_than_the_model_fails_before_training() -> None:
    cfg = DataConfig(source="synthetic", seq_len=16, kwargs={"num_samples": 64, "vocab_size": 64})
    with pytest.raises(DataError, match=r"outside the model's vocabulary \[0, 32\)"):
        build_dataset(cfg, vocab_size=32)
    assert len(build_dataset(cfg, vocab_size=64)) == 64
    eval_cfg = DataConfig(source="synthetic", seq_len=16, kwargs={"num_samples": 8, "vocab_size": 64})
    with pytest.raises(DataError, match="^eval.data: row"):
        build_dataset(eval_cfg, vocab_size=32, name="eval.data")
    packed = SyntheticChainDataset(4, 8, vocab_size=16)
    check_token_range(packed, vocab_size=16, sample_rows=1)


def test_a_factory_that_cannot_find_its_file(tmp_path: Path) -> None:
    cfg = DataConfig(source="factory", factory="t2mlr.tasks.s5_data:s5_retrieval_dataset",
                     kwargs={"path": str(tmp_path / "missing.jsonl"), "tokenizer": str(tmp_path)})
    with pytest.raises(DataError) as caught:
        build_dataset(cfg)
    assert str(caught.value).startswith("data: t2mlr.tasks.s5_data:s5_retrieval_dataset: ")
    assert "missing.jsonl" in str(caught.value)


def test_a_recorded_factory_that_moved_is_read_under_its_new_name(tmp_path: Path) -> None:
    """Run directories record the factory by name; those recorded before it moved still resume and analyse."""
    from t2mlr.training.config import with_current_factories

    old = DataConfig(source="factory", factory="t2mlr.experiments.retrofit_data:prompt_target_dataset",
                     kwargs={"path": "p", "tokenizer": "t", "max_length": 9, "mask_prompt_recurrence": True})
    assert (old.factory, old.kwargs) == ("t2mlr.tasks.sft:sft_dataset", {
        "bos": False, "path": "p", "tokenizer": "t", "max_length": 9, "prompt_recurrence_mask": True})
    tree = {"data": {"source": "factory", "factory": "t2mlr.experiments.s5_data:s5_stream_dataset", "kwargs": {"k": 1}}}
    assert with_current_factories(tree)["data"]["factory"] == "t2mlr.tasks.s5_data:s5_stream_dataset"
    assert tree["data"]["factory"] == "t2mlr.experiments.s5_data:s5_stream_dataset"  # the argument is left alone


def test_the_range_check_draws_nothing_from_the_global_generators(tmp_path: Path) -> None:
    """The trainer may build and check the data before it seeds and builds the model: that must not move the
    seeded streams (initial weights, dropout), or the same seed would train another model."""
    import random

    from t2mlr.experiments import s5 as experiment
    from t2mlr.experiments.sections import preset_config
    from t2mlr.training.config import config_from_tree, load_sections

    tree, sections = load_sections(preset_config("s5", "tiny"), [], {"task": experiment.S5Task})
    tokenizer, _ = experiment.prepare_data(sections["task"], 0, tmp_path / "data", {})
    filled = experiment.filled_tree(sections["task"], tree, tokenizer, tmp_path / "data" / "tokenizer")
    s5 = config_from_tree(filled).data
    synthetic = DataConfig(source="synthetic", seq_len=16, kwargs={"num_samples": 64, "vocab_size": 64})
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    build_dataset(s5, vocab_size=len(tokenizer))
    build_dataset(synthetic, vocab_size=64)
    after = (random.getstate(), np.random.get_state()[1], torch.get_rng_state())
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and torch.equal(before[2], after[2])
