"""Metrics on hand-computed cases."""

from __future__ import annotations

import pytest

from t2mlr.tasks.scoring import (
    aggregate_s5_by_n,
    extract_gsm_answer,
    gsm_exact_match,
    score_s5_prediction,
    score_s5_predictions,
    variable_assignment_exact_match,
)

# Two-entry dictionary with K = 1, the delimiter, then two actions' targets (state, value).
TARGET = ["<A_12345>", "x", "<A_21345>", "y", "|", "<A_21345>", "y", "<A_12345>", "x"]
START = 5


def test_s5_only_scores_after_delimiter() -> None:
    pred = list(TARGET)
    pred[0] = pred[1] = pred[4] = "WRONG"  # errors in the unscored part do not count
    assert score_s5_prediction(pred, TARGET, START) == (True, 4, 4)


def test_s5_partial_credit() -> None:
    pred = TARGET[:5] + ["<A_21345>", "z", "<A_12345>", "q"]
    score = score_s5_prediction(pred, TARGET, START)
    assert score == (False, 2, 4)
    assert score.exact is False and score.correct == 2 and score.total == 4


def test_s5_ids_work_and_length_is_checked() -> None:
    assert score_s5_prediction([1, 2, 3], [9, 2, 4], 1) == (False, 1, 2)
    with pytest.raises(ValueError):
        score_s5_prediction([1, 2], [1, 2, 3], 1)
    with pytest.raises(ValueError):
        score_s5_prediction([1, 2], [1, 2], 2)


def test_aggregate_by_n() -> None:
    records = [(2, (True, 4, 4)), (2, (False, 2, 4)), (1, (False, 0, 2)), (2, (False, 3, 4))]
    agg = aggregate_s5_by_n(records)
    assert list(agg) == [1, 2]
    assert agg[1] == (0.0, 0.0, 1)
    em, acc, count = agg[2]
    assert count == 3 and em == pytest.approx(1 / 3) and acc == pytest.approx(9 / 12)


def test_score_predictions_over_samples() -> None:
    samples = [{"n": 2, "target_tokens": TARGET, "score_start": START}] * 2
    preds = [TARGET, TARGET[:-1] + ["y"]]
    assert score_s5_predictions(samples, preds) == {2: (0.5, 7 / 8, 2)}
    with pytest.raises(ValueError):
        score_s5_predictions(samples, preds[:1])


def test_variable_assignment_exact_match() -> None:
    assert variable_assignment_exact_match(" 8\n", "8")
    assert variable_assignment_exact_match("| 8 <eos>", "8")
    assert not variable_assignment_exact_match("3", "8")
    assert not variable_assignment_exact_match("", "8")
    assert not variable_assignment_exact_match("88", "8")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("600*30/100=180\n180+60=240\n#### 360", "360"),
        ("#### 1 \n more #### 1,234.", "1234"),
        ("So the total is 5 apples. The answer is 12.", "12"),
        ("the answer is -3 dollars", "-3"),
        ("first 3 then 4.5 then 7", "7"),
        ("costs $1,000,000 in total", "1000000"),
        ("#### The Economist", "The Economist"),
        ("no numbers here", None),
    ],
)
def test_extract_gsm_answer(text: str, expected: str | None) -> None:
    assert extract_gsm_answer(text) == expected


def test_gsm_exact_match() -> None:
    assert gsm_exact_match("... #### 360", "360")
    assert gsm_exact_match("The answer is 360.0", "360")
    assert gsm_exact_match("#### 1,200", "1200")
    assert not gsm_exact_match("#### 361", "360")
    assert not gsm_exact_match("nothing", "360")
