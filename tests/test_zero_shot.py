"""`t2mlr eval zero-shot`: the paper's table from lm-eval results, and local task copies scored exactly as
lm-eval scores the same data through its own task loading."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager  # noqa: E402
from test_generation import WORDS, save_model_dir  # noqa: E402

import t2mlr.evaluation.lm_eval_model  # noqa: E402,F401  (registers "t2mlr")
from t2mlr.cli import main as cli_main  # noqa: E402
from t2mlr.evaluation.zero_shot import (  # noqa: E402
    PAPER_TASKS,
    MissingTaskDataError,
    local_task_files,
    run_zero_shot,
    table_markdown,
    zero_shot_row,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "lm_eval_zero_shot_results.json"
TASKS = {task.name: task for task in PAPER_TASKS}
ROWS = 60


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS[4:]) for _ in range(rng.randint(low, high)))


def write_arc_easy(path: Path, rows: int, seed: int = 0) -> Path:
    """Rows in allenai/ai2_arc's schema (ARC-Easy test split), labels A-D or 1-4 as in the real data."""
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        labels = ["A", "B", "C", "D"] if i % 5 else ["1", "2", "3", "4"]
        lines.append({"id": f"q{i}", "question": _words(rng, 3, 8) + " ?",
                      "choices": {"text": [_words(rng, 1, 4) for _ in labels], "label": labels},
                      "answerKey": rng.choice(labels)})
    return _write(path, lines)


def write_winogrande(path: Path, rows: int, seed: int = 1) -> Path:
    """Rows in allenai/winogrande's schema (winogrande_xl validation): one blank `_`, two options, answer "1"/"2"."""
    rng = random.Random(seed)
    lines = [{"sentence": f"{_words(rng, 2, 6)} _ {_words(rng, 2, 6)} .", "option1": _words(rng, 1, 2),
              "option2": _words(rng, 1, 2), "answer": rng.choice(["1", "2"])} for _ in range(rows)]
    return _write(path, lines)


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_all_tasks(root: Path, rows: int, seed: int = 2) -> Path:
    """A few rows of each of the seven tasks in the schema of the hub dataset it reads (the layout of the
    zero_shot module's docstring)."""
    rng = random.Random(seed)
    write_arc_easy(root / "arc_easy" / "test.jsonl", rows)
    write_arc_easy(root / "arc_challenge" / "test.jsonl", rows, seed=3)
    write_winogrande(root / "winogrande" / "validation.jsonl", rows)
    _write(root / "hellaswag" / "validation.jsonl", [
        {"ind": i, "activity_label": _words(rng, 1, 2), "ctx_a": _words(rng, 3, 6), "ctx_b": _words(rng, 1, 3),
         "ctx": "", "endings": [_words(rng, 2, 5) for _ in range(4)], "source_id": f"s{i}", "split": "val",
         "split_type": "indomain", "label": str(rng.randrange(4))} for i in range(rows)])
    _write(root / "openbookqa" / "test.jsonl", [
        {"id": f"o{i}", "question_stem": _words(rng, 3, 6),
         "choices": {"text": [_words(rng, 1, 3) for _ in range(4)], "label": ["A", "B", "C", "D"]},
         "answerKey": rng.choice("ABCD")} for i in range(rows)])
    _write(root / "piqa" / "validation.jsonl", [
        {"goal": _words(rng, 3, 6), "sol1": _words(rng, 2, 5), "sol2": _words(rng, 2, 5), "label": rng.randrange(2)}
        for _ in range(rows)])
    _write(root / "sciq" / "test.jsonl", [
        {"question": _words(rng, 3, 6), "distractor1": _words(rng, 1, 2), "distractor2": _words(rng, 1, 2),
         "distractor3": _words(rng, 1, 2), "correct_answer": _words(rng, 1, 2), "support": _words(rng, 0, 8)}
        for _ in range(rows)])
    return root


@pytest.fixture(scope="module")
def local_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("task_data")
    write_arc_easy(root / "arc_easy" / "test.jsonl", ROWS)
    write_winogrande(root / "winogrande" / "validation.jsonl", ROWS)
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("zero_shot") / "model")


def lm_eval_reference(model_dir: Path, data: Path, include: Path, **model_args: object) -> dict:
    """The same data through lm-eval's own task loading: a task YAML that includes lm-eval's definition and
    changes only where its documents come from (what a user of lm-eval's CLI would write)."""
    tasks_root = Path(lm_eval.__file__).parent / "tasks"
    include.mkdir(parents=True, exist_ok=True)
    (include / "arc_easy_local.yaml").write_text(
        f"include: {tasks_root / 'arc' / 'arc_easy.yaml'}\ntask: arc_easy\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data / 'arc_easy' / 'test.jsonl'}\n"
        "training_split: null\nvalidation_split: null\n", encoding="utf-8")
    (include / "winogrande_local.yaml").write_text(
        f"include: {tasks_root / 'winogrande' / 'default.yaml'}\ntask: winogrande\ndataset_path: json\n"
        f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    validation: {data / 'winogrande' / 'validation.jsonl'}\n"
        "training_split: null\n", encoding="utf-8")
    manager = TaskManager(include_path=str(include), include_defaults=False)
    return lm_eval.simple_evaluate(model="t2mlr", model_args={"pretrained": str(model_dir), "device": "cpu",
                                                              **model_args},
                                   tasks=["arc_easy", "winogrande"], task_manager=manager, num_fewshot=0,
                                   batch_size=4, log_samples=False)


@pytest.mark.slow
def test_local_copies_score_as_lm_eval_scores_the_same_data(model_dir, local_data, tmp_path) -> None:
    tasks = (TASKS["arc_easy"], TASKS["winogrande"])
    rows = run_zero_shot([str(model_dir)], tmp_path / "out", data_dir=local_data, batch_size=4, device="cpu",
                         recurrence="jacobi", d_forward=2, tasks=tasks)
    reference = lm_eval_reference(model_dir, local_data, tmp_path / "include", recurrence="jacobi", d_forward=2)
    ours = json.loads((tmp_path / "out" / "lm_eval" / "model.json").read_text())
    for task in tasks:
        for metric in ("acc,none", "acc_norm,none") if task.metric == "acc_norm" else ("acc,none",):
            assert ours["results"][task.name][metric] == reference["results"][task.name][metric], (task.name, metric)
        assert ours["n-samples"][task.name]["effective"] == ROWS
    (row,) = rows
    assert row["path"] == "jacobi (d_forward 2)" and row["checkpoint"] == "model"
    expected = [100 * reference["results"]["arc_easy"]["acc_norm,none"], 100 * reference["results"]["winogrande"]["acc,none"]]
    assert row["ARC-E"] == pytest.approx(expected[0]) and row["WG"] == pytest.approx(expected[1])
    assert row["Average"] == pytest.approx(sum(expected) / 2)
    table = (tmp_path / "out" / "zero_shot.md").read_text()
    assert "| model | jacobi (d_forward 2) |" in table and "local copies under" in table


def test_the_command_writes_the_seven_task_table_from_local_copies(model_dir, tmp_path, capsys) -> None:
    data = write_all_tasks(tmp_path / "data", rows=4)
    assert cli_main(["eval", "zero-shot", str(model_dir), "--out", str(tmp_path / "out"), "--data-dir", str(data),
                     "--device", "cpu", "--batch-size", "4"]) == 0
    (row,) = json.loads((tmp_path / "out" / "zero_shot.json").read_text())["rows"]
    scores = [row[task.column] for task in PAPER_TASKS]
    assert all(score in {0.0, 25.0, 50.0, 75.0, 100.0} for score in scores)  # 4 documents per task
    assert row["Average"] == pytest.approx(sum(scores) / 7) and row["path"] == "exact"
    assert set(row["samples"].values()) == {4}
    assert "average" in capsys.readouterr().out


def test_the_command_names_every_missing_task_file(local_data, tmp_path, capsys) -> None:
    code = cli_main(["eval", "zero-shot", str(tmp_path / "no_model"), "--out", str(tmp_path / "out"),
                     "--data-dir", str(local_data)])
    err = capsys.readouterr().err
    assert code == 2
    missing = [line.split()[0] for line in err.splitlines() if line.startswith("  ")]
    assert missing == ["arc_challenge/test.jsonl", "hellaswag/validation.jsonl", "openbookqa/test.jsonl",
                       "piqa/validation.jsonl", "sciq/test.jsonl"]
    assert "lacks the data of 5 task(s)" in err and not (tmp_path / "out").exists()
    with pytest.raises(MissingTaskDataError):
        local_task_files(tmp_path / "empty")


def test_local_parquet_copies_are_found(tmp_path) -> None:
    for task in PAPER_TASKS:
        (tmp_path / task.name).mkdir()
        (tmp_path / task.name / f"{task.split}.parquet").write_bytes(b"")
    assert {name: path.name for name, path in local_task_files(tmp_path).items()} == {
        "arc_challenge": "test.parquet", "arc_easy": "test.parquet", "hellaswag": "validation.parquet",
        "openbookqa": "test.parquet", "piqa": "validation.parquet", "sciq": "test.parquet",
        "winogrande": "validation.parquet"}


def test_the_table_maker_on_lm_eval_results_json() -> None:
    results = json.loads(FIXTURE.read_text())
    row = zero_shot_row("t2mlr_13_18", results)
    # the paper's T²MLR(13,18) row: 24.23 45.50 29.95 31.20 61.70 64.20 52.17, average 44.14
    assert [round(row[c], 2) for c in ("ARC-C", "ARC-E", "HS", "OBQA", "PIQA", "SciQ", "WG")] == [
        24.23, 45.50, 29.95, 31.20, 61.70, 64.20, 52.17]
    assert row["Average"] == pytest.approx((24.23 + 45.50 + 29.95 + 31.20 + 61.70 + 64.20 + 52.17) / 7)
    assert round(row["Average"], 2) == 44.14
    assert row["path"] == "jacobi (d_forward 16)"  # from the config lm-eval recorded for the t2mlr model
    baseline = json.loads(FIXTURE.read_text())
    baseline["config"]["t2mlr_recurrence"] = "none"
    baseline["results"]["winogrande"]["acc,none"] = 0.60
    other = zero_shot_row("baseline", baseline)
    assert other["path"] == "plain (no recurrence)" and other["WG"] == pytest.approx(60.0)
    lines = table_markdown([row, other])
    assert lines[0] == "| Model/Config | path | ARC-C | ARC-E | HS | OBQA | PIQA | SciQ | WG | Average |"
    assert lines[2].startswith("| Metric |  | acc_n ↑ |") and lines[2].endswith("| acc ↑ | - ↑ |")
    assert "| **60.00** |" in lines[4] and "| 52.17 |" in lines[3]  # the best value per column is bold
    del results["results"]["sciq"]
    with pytest.raises(ValueError, match="lack sciq acc_norm"):
        zero_shot_row("broken", results)
