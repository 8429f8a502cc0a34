"""The retrofit experiment's evaluation data and metrics: GSM8K (lm-eval's strict and flexible), MATH-500 (boxed,
MATH's normalisation), the paper preset reading every evaluation row, re-scoring saved replies, and bad input
refused before any model is loaded. Small local files written here; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.experiments import retrofit
from t2mlr.experiments.retrofit import (
    build_records,
    rescore_run,
    score_reply,
    write_summary,
)
from t2mlr.experiments.sections import preset_config
from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.loaders import math500_records
from t2mlr.training.config import load_sections


def omr_file(path: Path, rows: int = 3) -> Path:
    write_jsonl([{"problem": f"What is {i} + {i}?", "generated_solution": f"{i} + {i} = \\boxed{{{2 * i}}}",
                  "expected_answer": str(2 * i)} for i in range(rows)], path)
    return path


def test_paper_preset_evaluates_every_row_of_the_gsm8k_file(tmp_path: Path) -> None:
    """All 1319 problems of GSM8K's test split (a file of that many rows stands in for it), not a prefix."""
    gsm8k = tmp_path / "gsm8k_test.jsonl"
    write_jsonl([{"question": f"Q{i}?", "answer": f"step\n#### {i}"} for i in range(1319)], gsm8k)
    _, sections = load_sections(preset_config("retrofit", "paper"), [f"task.train_path={omr_file(tmp_path / 'omr.jsonl')}",
                                                                f"task.eval_path={gsm8k}"], {"task": retrofit.RetrofitTask})
    train, evaluation = build_records(sections["task"], 0)
    assert len(evaluation) == 1319 and evaluation[-1]["answer"] == "1318"
    assert [r["answer"] for r in train] == ["0", "2", "4"]


def test_math500_rows_in_either_published_form(tmp_path: Path) -> None:
    path = tmp_path / "math500.jsonl"
    write_jsonl([{"problem": "Half of one?", "answer": "\\frac{1}{2}", "subject": "Algebra", "level": 1},
                 {"problem": "Two plus two?", "solution": "It is $\\boxed{4}$."}], path)
    records = math500_records(path)
    assert [r["answer"] for r in records] == ["\\frac{1}{2}", "4"]
    assert records[0]["prompt"] == "Question: Half of one?\nAnswer:\n"
    assert len(math500_records(path, limit=1)) == 1


@pytest.mark.parametrize("row", [{"question": "Q?", "answer": "1"}, {"problem": "Q?"},
                                 {"problem": "Q?", "solution": "no box"}, {"problem": "Q?", "answer": " "}])
def test_math500_rows_without_a_reference_are_refused(tmp_path: Path, row: dict) -> None:
    path = tmp_path / "bad.jsonl"
    write_jsonl([row], path)
    with pytest.raises(ValueError, match="row 0"):
        math500_records(path)


def test_scores_per_evaluation_data() -> None:
    cut_off = "We know that Leo has 44 books.\nWe also know that 44"
    gsm = score_reply("gsm8k", cut_off, "44")
    assert gsm == {"strict_match": {"extracted": None, "correct": False},
                   "flexible_extract": {"extracted": "44", "correct": True}}
    math = score_reply("math500", "so $\\boxed{\\dfrac12}$", "\\frac{1}{2}")
    assert math == {"math_equiv": {"extracted": "\\dfrac12", "correct": True},
                    "math_verify": {"extracted": "\\dfrac12", "correct": True}}
    assert score_reply("math500", "#### 0.5", "\\frac{1}{2}")["math_equiv"]["correct"] is False  # boxed only


def fake_run(directory: Path, seed: int, replies: dict[str, list[tuple[str, str]]], eval_data: str = "arithmetic") -> Path:
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps({"preset": {"seed": seed, "eval_data": eval_data},
                                                        "models": {"base": {"accuracy": 0.99}}}))
    for name, rows in replies.items():
        write_jsonl([{"prompt": "p", "answer": answer, "reply": reply, "correct": True} for reply, answer in rows],
                    directory / "predictions" / f"{name}.jsonl")
    return directory


REPLIES = {
    "base": [("The answer is 12.", "12"), ("cut off after 7", "7"), ("nothing", "3")],
    "transformer": [("<<3+4=7>>\n#### 7", "7"), ("#### 8", "9"), ("#### 3", "3")],
    "t2mlr": [("#### 7", "7"), ("#### 9", "9"), ("#### 2 and then 3", "3")],
}


def test_rescoring_reads_the_replies_not_the_recorded_verdicts(tmp_path: Path) -> None:
    run = rescore_run(fake_run(tmp_path / "seed0", 0, REPLIES))
    solved = {name: {m: v["solved"] for m, v in info["metrics"].items()} for name, info in run["models"].items()}
    assert solved == {"base": {"strict_match": 1, "flexible_extract": 2},
                      "transformer": {"strict_match": 2, "flexible_extract": 2},
                      "t2mlr": {"strict_match": 2, "flexible_extract": 3}}
    assert run["models"]["base"]["accuracy"] == pytest.approx(1 / 3)  # the headline is strict-match


def test_summary_tables_are_recomputed_from_every_seed(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / "seed0", 0, REPLIES),
            fake_run(tmp_path / "seed1", 1, {k: v[:2] + [("#### 5", "5")] for k, v in REPLIES.items()})]
    payload = write_summary(runs, tmp_path / "summary")
    text = (tmp_path / "summary" / "summary.md").read_text()
    strict, flexible = text.split("## flexible-extract")
    assert "| pretrained, not finetuned | 0.333 | 0.667 | 0.500 | 0.333 |" in strict
    assert "| pretrained, not finetuned | 0.667 | 1.000 | 0.833 | 0.333 |" in flexible
    assert [r["seed"] for r in payload["runs"]] == [0, 1]


def test_summary_command_refuses_what_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["experiment", "retrofit-summary", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    assert "no results.json" in capsys.readouterr().err
    run = fake_run(tmp_path / "seed0", 0, {"base": REPLIES["base"]})
    assert cli_main(["experiment", "retrofit-summary", str(run), "--out", str(tmp_path / "s")]) == 2
    assert "replies of 'transformer' are missing" in capsys.readouterr().err


@pytest.fixture
def no_model_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(retrofit, "prepare_base", refuse)


@pytest.mark.parametrize(("extra", "message"), [
    (["--eval", "math500"], "needs --eval-path"),
    (["--eval", "math500", "--eval-path", "{missing}"], "data file not found"),
    (["--eval", "math500", "--eval-path", "{wrong}"], "needs 'problem' and 'answer'"),
    (["--eval", "math500", "--eval-path", "{empty}"], "no evaluation problems"),
])
def test_bad_evaluation_data_exits_2_before_any_model_is_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture, no_model_loading: None, extra: list[str], message: str
) -> None:
    (tmp_path / "wrong.jsonl").write_text(json.dumps({"question": "Q?", "answer": "#### 1"}) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    files = {"missing": tmp_path / "missing.jsonl", "wrong": tmp_path / "wrong.jsonl", "empty": tmp_path / "empty.jsonl"}
    argv = ["experiment", "retrofit", "--preset", "tiny", "--out", str(tmp_path / "out"),
            *[a.format(**files) for a in extra]]
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_eval_math500_reaches_the_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    def run(preset, task, tree, out, **options) -> None:
        seen["task"] = task
        (out / "results.md").write_text("", encoding="utf-8")  # what the command prints at the end

    monkeypatch.setattr(retrofit, "run", run)
    path = tmp_path / "math500.jsonl"
    write_jsonl([{"problem": "Q?", "answer": "1"}], path)
    assert cli_main(["experiment", "retrofit", "--preset", "paper", "--eval", "math500", "--eval-path", str(path),
                     "--train-path", "omr.parquet", "--out", str(tmp_path)]) == 0
    task = seen["task"]
    assert (task.eval_data, task.eval_path, task.eval_problems) == ("math500", str(path), None)
