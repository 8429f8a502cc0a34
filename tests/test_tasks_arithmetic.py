"""Generated arithmetic word problems: determinism, correct steps, GSM-Aug format, disjoint splits."""

from __future__ import annotations

import hashlib
import re
from fractions import Fraction
from pathlib import Path

import pytest

from t2mlr.tasks.arithmetic import (
    ArithmeticSettings,
    apply_operator,
    arithmetic_cot_records,
    few_shot_prompt,
    generate_arithmetic_problems,
    iter_arithmetic_problems,
    plain_prompt,
    split_of_steps,
)
from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.loaders import load_gsm_aug
from t2mlr.tasks.scoring import extract_gsm_answer, gsm_exact_match

STEP = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>")
NUMBER = re.compile(r"\d+")


def parse_step(step: str) -> tuple[int, str, int, int]:
    match = STEP.fullmatch(step)
    assert match, f"step {step!r} is not of the form <<a op b=c>>"
    a, op, b, c = match.groups()
    return int(a), op, int(b), int(c)


def exact_value(a: int, op: str, b: int) -> Fraction:
    """Independent of the module: exact rational arithmetic, so an inexact division shows up as a fraction."""
    return {"+": Fraction(a) + b, "-": Fraction(a) - b, "*": Fraction(a) * b, "/": Fraction(a, b)}[op]


@pytest.fixture(scope="module")
def train_problems() -> list[dict]:
    return generate_arithmetic_problems(1500, "train", seed=0)


@pytest.fixture(scope="module")
def eval_problems() -> list[dict]:
    return generate_arithmetic_problems(300, "eval", seed=0)


# ------------------------------------------------------------------------------------------ determinism
def test_same_seed_same_problems_and_prefix_stable() -> None:
    first = generate_arithmetic_problems(40, "train", seed=3)
    assert first == generate_arithmetic_problems(40, "train", seed=3)
    assert generate_arithmetic_problems(15, "train", seed=3) == first[:15]
    assert first != generate_arithmetic_problems(40, "train", seed=4)


def test_stream_matches_the_list() -> None:
    stream = iter_arithmetic_problems("eval", seed=1)
    assert [next(stream) for _ in range(10)] == generate_arithmetic_problems(10, "eval", seed=1)


# ------------------------------------------------------------------------------------------ correctness
def test_every_step_is_correct_and_chained(train_problems: list[dict], eval_problems: list[dict]) -> None:
    settings = ArithmeticSettings()
    for problem in train_problems + eval_problems:
        parsed = [parse_step(s) for s in problem["steps"]]
        for i, (a, op, b, c) in enumerate(parsed):
            assert exact_value(a, op, b) == c, problem  # integer result, correctly written
            assert 1 <= c <= settings.max_value
            if i > 0:
                assert a == parsed[i - 1][3], f"step {i} does not continue from the previous result: {problem}"
        assert problem["ops"] == [op for _, op, _, _ in parsed]
        assert problem["answer"] == str(parsed[-1][3])
        assert problem["num_steps"] == len(parsed)
        assert settings.min_steps <= len(parsed) <= settings.max_steps


def test_operands_respect_the_settings(train_problems: list[dict]) -> None:
    settings = ArithmeticSettings()
    for problem in train_problems:
        for i, (a, op, b, _) in enumerate(parse_step(s) for s in problem["steps"]):
            if op in "+-":
                assert 2 <= b <= settings.max_operand
            elif i > 0 or op == "/":  # an opening product is boxes × per-box count
                assert 2 <= b <= settings.max_factor


def test_question_states_the_numbers_of_the_steps(train_problems: list[dict]) -> None:
    """The story's numbers, in order, are the first operand and then each step's second operand."""
    for problem in train_problems:
        parsed = [parse_step(s) for s in problem["steps"]]
        expected = [parsed[0][0]] + [b for _, _, b, _ in parsed]
        assert [int(n) for n in NUMBER.findall(problem["question"])] == expected, problem


def test_question_wording_matches_the_operators(train_problems: list[dict]) -> None:
    for problem in train_problems:
        question, ops = problem["question"], problem["ops"]
        opening_product = "boxes" in question
        assert question.count("times as many") == ops.count("*") - int(opening_product)
        assert question.count(" equal") == ops.count("/")
        assert question.endswith("?") and question.count("?") == 1


def test_all_operators_and_step_counts_occur(train_problems: list[dict]) -> None:
    assert {op for p in train_problems for op in p["ops"]} == {"+", "-", "*", "/"}
    assert {p["num_steps"] for p in train_problems} == {2, 3, 4}


def test_settings_change_the_ranges() -> None:
    settings = ArithmeticSettings(min_steps=3, max_steps=3, max_operand=10, max_factor=3, max_value=40)
    for problem in generate_arithmetic_problems(200, "train", seed=0, settings=settings):
        assert problem["num_steps"] == 3
        for a, op, b, c in (parse_step(s) for s in problem["steps"]):
            assert exact_value(a, op, b) == c <= 40


# ------------------------------------------------------------------------------------------ GSM-Aug format
def test_targets_extract_to_the_answer(train_problems: list[dict]) -> None:
    records = arithmetic_cot_records(200, "train", seed=0)
    for problem, record in zip(train_problems, records):
        assert record["prompt"] == problem["question"] + "\n"
        assert record["target"] == "\n".join(problem["steps"]) + "\n#### " + problem["answer"]
        assert extract_gsm_answer(record["target"]) == problem["answer"] == record["answer"]
        assert gsm_exact_match(record["target"], record["answer"])


def test_jsonl_round_trip_through_load_gsm_aug(tmp_path: Path) -> None:
    path = tmp_path / "arith.jsonl"
    write_jsonl(generate_arithmetic_problems(25, "eval", seed=2), path)
    assert load_gsm_aug(path=path) == arithmetic_cot_records(25, "eval", seed=2)


def test_prompts() -> None:
    shots = generate_arithmetic_problems(2, "train", seed=5)
    assert plain_prompt(" How many? ") == "Question: How many?\nAnswer:"
    prompt = few_shot_prompt(shots, "Q?")
    blocks = prompt.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == "Question: Q?\nAnswer:\n"
    for shot, block in zip(shots, blocks):
        assert (
            block == f"Question: {shot['question']}\nAnswer:\n" + "\n".join(shot["steps"]) + f"\n#### {shot['answer']}"
        )


# ------------------------------------------------------------------------------------------ splits
def test_train_and_eval_are_disjoint(train_problems: list[dict], eval_problems: list[dict]) -> None:
    other_seed_eval = generate_arithmetic_problems(300, "eval", seed=1)
    train_chains = {tuple(p["steps"]) for p in train_problems}
    train_questions = {p["question"] for p in train_problems}
    for problem in eval_problems + other_seed_eval:
        assert tuple(problem["steps"]) not in train_chains
        assert problem["question"] not in train_questions


def test_split_is_the_hash_bucket_of_the_chain(train_problems: list[dict], eval_problems: list[dict]) -> None:
    def bucket(steps: list[str]) -> int:
        return int.from_bytes(hashlib.sha256(";".join(steps).encode()).digest()[:8], "big") % 10

    assert all(p["split"] == "train" and bucket(p["steps"]) != 0 for p in train_problems)
    assert all(p["split"] == "eval" and bucket(p["steps"]) == 0 for p in eval_problems)
    assert split_of_steps(["<<1+1=2>>"]) in ("train", "eval")


def test_questions_are_distinct_within_a_split(train_problems: list[dict], eval_problems: list[dict]) -> None:
    for problems in (train_problems, eval_problems):
        assert len({p["question"] for p in problems}) == len(problems)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"min_steps": 0}, "min_steps"),
        ({"min_steps": 3, "max_steps": 2}, "min_steps <= max_steps"),
        ({"max_steps": 9}, "max_steps <= 8"),
        ({"max_operand": 1}, "max_operand must be >= 2"),
        ({"max_factor": 1}, "max_factor must be >= 2"),
        ({"max_operand": 60, "max_value": 100}, "max_value must be >= 2 \\* max_operand = 120"),
        ({"max_value": 999.0}, "max_value must be an int"),
        ({"min_steps": True}, "min_steps must be an int"),
    ],
)
def test_bad_settings_raise(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_arithmetic_problems(1, settings=ArithmeticSettings(**overrides))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num": 1, "split": "test"}, "split must be one of"),
        ({"num": -1}, "num must be a non-negative int"),
        ({"num": 2.0}, "num must be a non-negative int"),
        ({"num": 1, "seed": "0"}, "seed must be an int"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_arithmetic_problems(**kwargs)


def test_exhausted_problem_space_raises_instead_of_looping() -> None:
    # these settings allow three chains (<<2+2=4>>, <<2*2=4>>, <<2/2=1>>), all in the training bucket
    tiny = ArithmeticSettings(min_steps=1, max_steps=1, max_operand=2, max_factor=2, max_value=4)
    with pytest.raises(ValueError, match="no more distinct"):
        generate_arithmetic_problems(10_000, "eval", settings=tiny)


def test_apply_operator_refuses_inexact_division_and_unknown_operators() -> None:
    assert apply_operator(12, "/", 4) == 3
    with pytest.raises(ValueError, match="not an exact integer division"):
        apply_operator(7, "/", 2)
    with pytest.raises(ValueError, match="operator must be one of"):
        apply_operator(2, "^", 3)
