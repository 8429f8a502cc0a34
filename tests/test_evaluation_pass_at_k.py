"""pass@k with k samples per problem (the unbiased estimator against its closed form on hand cases and against
counting the subsets of samples by brute force), MATH's boxed answer checked by math-verify, and the finetune
experiment sampling several replies per problem, saving every one and reporting pass@k."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.evaluation.generation import SamplingPlan, pass_at_k_table
from t2mlr.tasks.scoring import math_equiv, mean_pass_at_k, pass_at_k

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - Fraction(3, 10)),  # 1 − C(3,2)/C(5,2)
    (10, 3, 1, Fraction(3, 10)),     # k = 1: the share right
    (4, 0, 2, 0),                    # nothing right
    (4, 4, 3, 1),                    # everything right
    (6, 4, 3, 1),                    # fewer wrong samples (2) than k: some right one is always drawn
    (8, 1, 4, Fraction(1, 2)),       # one right sample, half of them drawn
])
def test_pass_at_k_is_the_closed_form_on_hand_cases(n: int, c: int, k: int, expected: Fraction) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-15)


def test_pass_at_k_counts_the_subsets_that_hold_a_right_sample() -> None:
    """For every n <= 7: the share of the C(n, k) k-subsets of n samples (c of them right) with a right one."""
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                brute = Fraction(sum(any(subset) for subset in subsets), len(subsets))
                assert len(subsets) == comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(float(brute), abs=1e-12), (n, c, k)


def test_pass_at_k_averages_over_problems_and_refuses_impossible_counts() -> None:
    assert mean_pass_at_k([0, 2, 4], 4, 2) == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)
    assert pass_at_k_table([1, 3], 3, (1, 3)) == pytest.approx({1: 4 / 6, 3: 1.0})
    with pytest.raises(ValueError, match=r"pass@4 needs 1 <= k <= samples per problem \(3\)"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match=r"correct must be in 0\.\.samples"):
        pass_at_k(3, 5, 1)
    with pytest.raises(ValueError, match="at least one problem"):
        mean_pass_at_k([], 3, 1)


@pytest.mark.parametrize("settings, message", [
    (dict(samples=4, pass_k=(1, 8)), r"every k must be in 1\.\.samples \(4\).*raise samples to 8 or drop \[8\]"),
    (dict(samples=4, pass_k=(0,)), r"drop \[0\]"),
    (dict(samples=4, pass_k=(2, 2)), "names a k twice"),
    (dict(samples=1, temperature=0.7), "one sample per problem is greedy"),
    (dict(samples=2, pass_k=(1,), top_p=0.0), "0 < top_p <= 1"),
    (dict(samples=0), "samples must be an int >= 1"),
])
def test_sampling_plans_that_cannot_hold_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingPlan(**settings)


def test_greedy_and_sampled_plans_set_the_decoding() -> None:
    greedy = SamplingPlan().generation_settings(max_new_tokens=3)
    assert not greedy.do_sample and SamplingPlan().describe() == "greedy"
    sampled = SamplingPlan(samples=4, pass_k=(1, 4), temperature=0.7, top_p=0.9).generation_settings(max_new_tokens=3)
    assert (sampled.do_sample, sampled.temperature, sampled.top_p) == (True, 0.7, 0.9)


math_verify = pytest.importorskip("math_verify")
from t2mlr.tasks.scoring import math_verify_equiv, math_verify_match  # noqa: E402


@pytest.mark.parametrize("reply, answer, equal", [
    ("so $\\boxed{\\tfrac{2}{4}}$", "\\frac{1}{2}", True),   # equal values the string rule misses
    ("\\boxed{0.5}", "\\frac12", True),
    ("\\boxed{x(x+2)}", "x^2+2x", True),
    ("\\boxed{(1, 2]}", "(1,2]", True),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", True),
    ("first \\boxed{2} then \\boxed{3}", "2", False),        # the last box counts
    ("\\boxed{(1, 2)}", "(1,2]", False),                     # an open end is another interval
    ("\\boxed{3}", "4", False),
    ("no box: 7", "7", False),                               # boxed answers only
])
def test_math_verify_compares_boxed_answers_as_mathematics(reply: str, answer: str, equal: bool) -> None:
    assert math_verify_equiv(reply, answer) is equal
    assert math_verify_match(None, answer) is False


def test_math_verify_sees_what_the_string_rule_misses() -> None:
    reply, answer = "so $\\boxed{\\tfrac{2}{4}}$", "\\frac{1}{2}"
    assert math_verify_equiv(reply, answer) and not math_equiv(reply, answer)


# ---------------------------------------------------------------------------------------------- the finetune


def run_finetune(out: Path, *overrides: str) -> int:
    return cli_main(["experiment", "finetune", "variable-assignment", "--preset", "tiny", "--out", str(out),
                     "--eval-size", "4", "--workers", "1", "--threads", "1", *overrides])


def test_k_above_the_samples_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_finetune(tmp_path / "run", "task.samples=4", "task.pass_k=[1,8]") == 2
    assert "raise samples to 8" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_sampled_replies_are_saved_and_scored_by_pass_at_k(tmp_path: Path) -> None:
    """Three sampled replies per problem: every one in predictions.jsonl with its prompt and score, and pass@k
    in results.json equal to the estimator over those rows, and to rescoring the file."""
    from t2mlr.experiments.finetune import rescore_predictions

    out = tmp_path / "run"
    assert run_finetune(out, "task.samples=3", "task.pass_k=[1,2,3]", "task.temperature=1.5") == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    payload = json.loads((out / "results.json").read_text())
    problems = payload["data_facts"]["eval_records"]
    assert len(rows) == 2 * problems * 3
    for result in payload["results"]:
        mine = [row for row in rows if row["arm"] == result["arm"]]
        drawn = sorted((row["index"], row["draw"]) for row in mine)
        assert drawn == [(i, d) for i in range(problems) for d in range(3)]
        assert {"prompt", "gold", "generated", "extracted", "correct"} <= set(mine[0])
        counts = [sum(row["correct"] for row in mine if row["index"] == i) for i in range(problems)]
        for k in (1, 2, 3):  # by brute force over the 3 samples of each problem
            brute = sum(sum(any(s) for s in itertools.combinations([True] * c + [False] * (3 - c), k)) / comb(3, k)
                        for c in counts) / problems
            assert result["extra"][f"pass@{k}"] == pytest.approx(brute)
            assert rescore_predictions("variable-assignment", out / "predictions.jsonl", k)[result["arm"]] == \
                pytest.approx(brute)
        assert result["pass_at_1"] == pytest.approx(sum(counts) / (3 * problems))
        assert result["total"] == 3 * problems
    text = (out / "results.md").read_text()
    assert "3 sampled replies per problem" in text and "pass@3" in text
    assert "3 replies per problem sampled at temperature 1.5, top-p 1" in text
