"""The ``data`` command group end to end, with tiny sizes."""

from __future__ import annotations

import argparse
import json

import pytest
from transformers import AutoTokenizer

from t2mlr.tasks.commands import main, parse_range, register
from t2mlr.tasks.jsonl import read_jsonl
from t2mlr.tasks.prosqa import check_path
from t2mlr.tasks.s5_retrieval import s5_targets_from_input
from t2mlr.tasks.tokenizers import encode_s5_sample
from t2mlr.tasks.variable_assignment import solve_variable_assignment


def test_register_adds_data_group() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "s5-retrieval", "--out", "x", "--train-n", "2-5"])
    assert args.train_n == (2, 5) and args.k == 4 and args.eval_n == (1, 48) and callable(args.func)


def test_parse_range() -> None:
    assert parse_range("1-32") == (1, 32) and parse_range("7") == (7, 7)
    for bad in ("5-1", "a-b", "1-2-3", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_range(bad)


def test_s5_command(tmp_path, capsys) -> None:
    out = tmp_path / "s5"
    code = main(["data", "s5-retrieval", "--out", str(out), "--train-n", "1-4", "--eval-n", "1-3",
                 "--train-size", "6", "--eval-size", "2", "--dict-size", "8", "--seed", "1"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "train.jsonl" in printed and "eval.jsonl" in printed and "tokenizer" in printed
    train, evals = read_jsonl(out / "train.jsonl"), read_jsonl(out / "eval.jsonl")
    assert len(train) == 6 and [s["n"] for s in evals] == [1, 1, 2, 2, 3, 3]
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    for s in train + evals:
        assert s["target_tokens"] == s5_targets_from_input(s["input_tokens"])
        assert len(encode_s5_sample(tok, s)["input_ids"]) == len(s["input_tokens"])
    assert json.loads((out / "meta.json").read_text())["dict_size"] == 8


def test_s5_command_bad_dict_size_is_a_usage_error(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["data", "s5-retrieval", "--out", str(tmp_path), "--train-n", "1-32", "--dict-size", "8"])
    assert not any(tmp_path.iterdir())  # nothing written


def test_variable_assignment_command(tmp_path) -> None:
    out = tmp_path / "va"
    assert main(["data", "variable-assignment", "--out", str(out), "--size", "20", "--eval-size", "10"]) == 0
    train, evals = read_jsonl(out / "train.jsonl"), read_jsonl(out / "eval.jsonl")
    assert len(train) == 20 and len(evals) == 10
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in evals}
    assert all(solve_variable_assignment(s["prompt"]) == s["answer"] for s in train + evals)


def test_prosqa_command(tmp_path) -> None:
    out = tmp_path / "pq"
    assert main(["data", "prosqa-hard", "--out", str(out), "--train-size", "4", "--eval-size", "2",
                 "--nodes", "20-24", "--path-len", "4-5"]) == 0
    train, evals = read_jsonl(out / "train.jsonl"), read_jsonl(out / "eval.jsonl")
    assert len(train) == 4 and len(evals) == 2
    assert all(check_path(s, s["target"]) for s in train + evals)


def test_variable_assignment_command_mixes_training_depths_only(tmp_path) -> None:
    out = tmp_path / "va"
    assert main(["data", "variable-assignment", "--out", str(out), "--size", "60", "--eval-size", "20",
                 "--depth", "3", "--min-depth", "1"]) == 0
    assert {s["depth"] for s in read_jsonl(out / "train.jsonl")} == {1, 2, 3}
    assert {s["depth"] for s in read_jsonl(out / "eval.jsonl")} == {3}


def test_prosqa_command_with_a_name_pool(tmp_path) -> None:
    out = tmp_path / "pq"
    assert main(["data", "prosqa-hard", "--out", str(out), "--train-size", "6", "--eval-size", "4",
                 "--nodes", "7-8", "--path-len", "2-2", "--name-pool", "12"]) == 0
    rows = read_jsonl(out / "train.jsonl") + read_jsonl(out / "eval.jsonl")
    assert len({x for s in rows for e in s["edges"] for x in e}) <= 12
    assert all(check_path(s, s["target"]) for s in rows)
