"""Metrics on hand-computed cases."""

from __future__ import annotations

import pytest

from t2mlr.tasks.scoring import (
    aggregate_s5_by_n,
    extract_gsm_answer,
    extract_math_answer,
    gsm8k_flexible_extract,
    gsm8k_flexible_match,
    gsm8k_match,
    gsm8k_strict_extract,
    gsm8k_strict_match,
    gsm_exact_match,
    math_equiv,
    normalize_math_answer,
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


# ---------------------------------------------------------------------------------------------- lm-eval's GSM8K

# Replies of the kinds a finetune produces: the marker, the CoT phrase, both, neither, cut off, odd number forms.
GSM8K_REPLIES = [
    ("<<5*48=240>>\n<<240*2=480>>\n<<480-31=449>>\n#### 449", "449"),
    ("<<5*48=240>>\n#### 240\nmore text #### 449", "449"),
    ("Let's break it down step by step:\n1. Emma buys 5 boxes with 32 beads in each box.\n2. She splits the 32", "32"),
    ("So she has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8.", "8"),
    ("The answer is 8", "8"),
    ("It costs $1,200.", "1200"),
    ("#### $1,200", "1200"),
    ("#### -3", "-3"),
    ("#### 360.0", "360"),
    ("The answer is 42. #### 41", "41"),
    ("no digits at all", "5"),
    ("", "5"),
    ("the total is 7 and 5", "5"),
    ("#### 1.5.", "1.5"),
]


def _lm_eval_gsm8k(replies: list[str], answers: list[str]) -> tuple[list[bool], list[bool]]:
    """lm-eval's own filters and metric, configured as its gsm8k (strict: #### then gsm8k-cot's phrase) task."""
    extraction = pytest.importorskip("lm_eval.filters.extraction")
    metrics = pytest.importorskip("lm_eval.api.metrics")
    ignore = [",", "\\$", "(?s).*#### ", "\\.$"]

    def score(predictions: list[str]) -> list[bool]:
        return [bool(metrics.exact_match_hf_evaluate([p], [a], regexes_to_ignore=ignore, ignore_case=True,
                                                     ignore_punctuation=False)["exact_match"])
                for p, a in zip(predictions, answers)]

    def filtered(regex_filter, reply: str) -> str:
        [[answer]] = regex_filter.apply([[reply]], [{}])
        return answer

    marker = extraction.RegexFilter(r"#### (\-?[0-9\.\,]+)")
    phrase = extraction.RegexFilter(r"The answer is (\-?[0-9\.\,]+).")
    strict = [filtered(marker, r) if filtered(marker, r) != "[invalid]" else filtered(phrase, r) for r in replies]
    flexible_filter = extraction.RegexFilter(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)
    return score(strict), score([filtered(flexible_filter, r) for r in replies])


def test_gsm8k_metrics_agree_with_lm_eval() -> None:
    replies, answers = [r for r, _ in GSM8K_REPLIES], [a for _, a in GSM8K_REPLIES]
    strict, flexible = _lm_eval_gsm8k(replies, answers)
    assert [gsm8k_strict_match(r, a) for r, a in GSM8K_REPLIES] == strict
    assert [gsm8k_flexible_match(r, a) for r, a in GSM8K_REPLIES] == flexible
    assert any(strict) and any(flexible) and strict != flexible  # the cases tell the metrics apart


def test_gsm8k_cut_off_reply_is_right_only_by_the_last_number() -> None:
    """The retrofit's seed-1 case: a reply cut off mid-sentence whose last number, copied from the question,
    happens to be the answer. The project's extractor and flexible-extract call it right; strict-match does not."""
    reply = "We know that Leo has 44 books.\nWe also know that 19 books are his uncle's.\nWe also know that 44"
    assert gsm8k_strict_extract(reply) is None and not gsm8k_strict_match(reply, "44")
    assert gsm8k_flexible_extract(reply) == "44" and gsm8k_flexible_match(reply, "44")
    assert gsm_exact_match(reply, "44")


def test_gsm8k_extractors_by_hand() -> None:
    assert gsm8k_strict_extract("a #### 12 b #### 13") == "12"  # the first marker, as lm-eval's take_first
    assert gsm8k_strict_extract("The answer is 42") == "4"  # lm-eval's pattern wants one character after the number
    assert gsm8k_flexible_extract("from 3 to $4.50.") == "$4.50."
    assert gsm8k_match("$4.50.", "4.50") and not gsm8k_match("360.0", "360") and not gsm8k_match(None, "1")


# ---------------------------------------------------------------------------------------------- MATH

MATH_CASES = [
    ("Hence the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac12"),
    ("$\\boxed{\\dfrac{3}{4}}$", "3/4"),
    ("so $x = \\boxed{0.5}$", "\\frac{1}{2}"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})"),
    ("first \\boxed{2} then \\boxed{3}", "3"),
    ("first \\boxed{2} then \\boxed{3}", "2"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"),
    ("\\boxed{5\\text{ cm}}", "5"),
    ("\\boxed{.5}", "0.5"),
    ("the answer is 7", "7"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{-3/4}", "-\\frac{3}{4}"),
    ("\\fbox{12}", "12"),
    ("\\boxed 7$", "7"),
]


def _lm_eval_math(reply: str, answer: str) -> bool:
    """lm-eval's hendrycks_math answer check, applied to the reply's last boxed expression."""
    utils = pytest.importorskip("lm_eval.tasks.hendrycks_math.utils")
    boxed = utils.last_boxed_only_string(reply)
    if boxed is None:
        return False
    if boxed.startswith("\\fbox{"):  # its remove_boxed knows \boxed only
        boxed = "\\boxed{" + boxed[len("\\fbox{"):]
    return utils.is_equiv(utils.remove_boxed(boxed), answer)


@pytest.mark.parametrize(("reply", "answer"), MATH_CASES)
def test_math_equiv_agrees_with_lm_eval(reply: str, answer: str) -> None:
    assert math_equiv(reply, answer) == _lm_eval_math(reply, answer)


def test_math_equiv_by_hand() -> None:
    assert math_equiv("$\\boxed{\\frac{1}{2}}$", "0.5") and math_equiv("\\boxed{x=5}", "5")
    assert not math_equiv("first \\boxed{2} then \\boxed{3}", "2")  # the last box counts
    assert not math_equiv("no box: 7", "7") and not math_equiv("\\boxed{7", "7")
    assert extract_math_answer("\\boxed{\\frac{a}{\\sqrt{b}}}") == "\\frac{a}{\\sqrt{b}}"
    assert normalize_math_answer("\\left( 3 , \\dfrac{\\pi}{2}\\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_math_answer("k = \\frac12") == "\\frac{1}{2}"
