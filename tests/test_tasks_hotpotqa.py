"""`t2mlr data hotpotqa-cot`: HotpotQA files joined with chain-of-thought traces, on small files written here in
both of HotpotQA's published layouts; the result is read by the finetune's own data loader and scorer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.tasks.reasoning import load_task_data, score_output
from t2mlr.tasks.hotpotqa import build_hotpotqa_cot, context_text
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl

HUB_CONTEXT = {"title": ["Radio City", "Arthur's Magazine"],
               "sentences": [["Radio City is an FM station.", " It started in 2001."], ["A magazine.", " Of 1844."]]}
TRAIN = [
    {"id": "q1", "question": "Which started first?", "answer": "Arthur's Magazine", "context": HUB_CONTEXT},
    {"id": "q2", "question": "When did Radio City start?", "answer": "2001", "context": HUB_CONTEXT},
    {"id": "q3", "question": "Is it a station?", "answer": "yes", "context": HUB_CONTEXT},
    {"id": "q4", "question": "What is Radio City?", "answer": "an FM station", "context": HUB_CONTEXT},
]
TRACES = [
    {"id": "q1", "output": "Arthur's Magazine dates from 1844.\nRadio City from 2001.\nSo \\boxed{Arthur's Magazine}"},
    {"question": "When did Radio City start?", "output": "It started in 1999.\n\\boxed{1999}"},  # wrong, keyed by text
    {"_id": "q4", "steps": ["Radio City is an FM station.", "#### The FM station"]},  # right after normalisation
]
# the original release's layout: one JSON list, `_id`, context as [[title, [sentences]], ...]
EVAL = [{"_id": "d1", "question": "Which is a magazine?", "answer": "Arthur's Magazine",
         "context": [["Arthur's Magazine", ["A magazine.", " Of 1844."]], ["Radio City", ["An FM station."]]]}]


def write_inputs(tmp_path: Path, traces: list[dict] = TRACES) -> dict[str, Path]:
    paths = {"train": tmp_path / "hotpot_train.jsonl", "traces": tmp_path / "traces.jsonl", "eval": tmp_path / "dev.json"}
    write_jsonl(TRAIN, paths["train"])
    write_jsonl(traces, paths["traces"])
    paths["eval"].write_text(json.dumps(EVAL))
    return paths


def run(paths: dict[str, Path], out: Path, *extra: str) -> int:
    return cli_main(["data", "hotpotqa-cot", "--hotpotqa-train", str(paths["train"]), "--traces", str(paths["traces"]),
                      "--hotpotqa-eval", str(paths["eval"]), "--out", str(out), *extra])


def test_context_reads_both_layouts_the_same() -> None:
    release = [[t, s] for t, s in zip(HUB_CONTEXT["title"], HUB_CONTEXT["sentences"])]
    text = context_text(HUB_CONTEXT, "here")
    assert text == context_text(release, "here")
    assert text.splitlines() == ["Radio City: Radio City is an FM station. It started in 2001.",
                                 "Arthur's Magazine: A magazine. Of 1844."]


def test_builder_keeps_only_traces_that_state_the_right_answer(tmp_path: Path) -> None:
    build = build_hotpotqa_cot(*write_inputs(tmp_path).values())
    assert [r["id"] for r in build.train] == ["q1", "q4"]
    assert (build.no_trace, build.wrong_answer, build.no_answer_in_trace, build.kept_wrong) == (1, 1, 0, 0)
    assert build.train[1]["steps"] == "Radio City is an FM station.\n#### The FM station"
    assert [r["id"] for r in build.test] == ["d1"] and build.test[0]["steps"] == ""
    kept = build_hotpotqa_cot(*write_inputs(tmp_path).values(), keep_wrong=True)
    assert [r["id"] for r in kept.train] == ["q1", "q2", "q4"] and kept.kept_wrong == 1


def test_built_directory_feeds_the_finetune_and_its_scorer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "hotpotqa_cot"
    assert run(write_inputs(tmp_path), out) == 0
    assert "2 training records (1 questions without a trace" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["wrong_answer"] == 1
    train, evaluation, dropped = load_task_data("hotpotqa", {}, 0, 10, 0, data=str(out))
    assert len(train) == 2 and len(evaluation) == 1 and dropped == 0
    first = train[0]
    assert first["prompt"].startswith("Which started first?\nContext:\nRadio City: Radio City is an FM station.")
    assert first["target"].endswith("So \\boxed{Arthur's Magazine}\n#### Arthur's Magazine")
    assert score_output("hotpotqa", first, first["target"]).correct  # the trace's own answer scores right
    assert evaluation[0]["answer"] == "Arthur's Magazine" and "Arthur's Magazine: A magazine. Of 1844." in evaluation[0]["prompt"]
    assert read_jsonl(out / "test.jsonl")[0]["id"] == "d1"


@pytest.mark.parametrize(("traces", "message"), [
    ([{"id": "q9", "output": "\\boxed{x}"}], "id 'q9' is not in the HotpotQA training file"),
    ([{"question": "Never asked?", "output": "\\boxed{x}"}], "no HotpotQA training question has this text"),
    ([{"id": "q1", "output": "\\boxed{a}"}, {"id": "q1", "output": "\\boxed{b}"}], "a second trace for question 'q1'"),
    ([{"id": "q1", "text": "\\boxed{a}"}], "reasoning in 'output'"),
    ([{"output": "\\boxed{a}"}], "needs id (or _id) or the question's text"),
    ([{"id": "q1", "output": "no answer stated"}], "no training record left"),
])
def test_bad_traces_exit_2_naming_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture, traces: list[dict],
                                            message: str) -> None:
    assert run(write_inputs(tmp_path, traces), tmp_path / "out") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_hotpotqa_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = write_inputs(tmp_path)
    assert run({**paths, "train": tmp_path / "missing.jsonl"}, tmp_path / "out") == 2
    assert "data file not found" in capsys.readouterr().err
    write_jsonl([{"id": "q1", "question": "Q?", "answer": "a"}], tmp_path / "no_context.jsonl")
    assert run({**paths, "train": tmp_path / "no_context.jsonl"}, tmp_path / "out") == 2
    assert "missing ['context']" in capsys.readouterr().err
    (tmp_path / "dict.json").write_text(json.dumps({"not": "a list"}))
    assert run({**paths, "eval": tmp_path / "dict.json"}, tmp_path / "out") == 2
    assert "must hold a list of objects" in capsys.readouterr().err
    assert run(paths, tmp_path / "out", "--eval-size", "0") == 2
