"""`t2mlr experiment pathfinding`: the tiny preset end to end through the command line (every file written, each
prediction's verdict the reference's, the reported pass@1 what the predictions re-score to), the release's files
as --data, a bad row refused with its file:line before any arm trains (exit 2), and the presets' plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tasks_pathfinding import is_shortest_path, preset_settings

from t2mlr.cli import main as cli_main
from t2mlr.experiments import pathfinding
from t2mlr.experiments.commands import load
from t2mlr.experiments.finetune import StartingPoint, rescore_predictions
from t2mlr.experiments.sections import preset_config
from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.pathfinding import generate_pathfinding, parse_path


def _run(out: Path, *extra: str) -> int:
    return cli_main(["experiment", "pathfinding", "--preset", "tiny", "--out", str(out), "--workers", "1",
                     "--threads", "1", *extra])


def test_the_tiny_preset_runs_end_to_end_and_its_scores_are_the_references(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(out) == 0
    for name in ("results.md", "results.json", "predictions.jsonl", "pass_at_1.png", "data/eval.jsonl"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "results.json").read_text())
    assert payload["task"] == "pathfinding" and payload["preset"]["name"] == "tiny"
    reported = {r["arm"]: r["pass_at_1"] for r in payload["results"]}
    assert set(reported) == {"t2mlr:1-2", "transformer"}
    assert rescore_predictions("pathfinding", out / "predictions.jsonl") == pytest.approx(reported)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * payload["data_facts"]["eval_records"] == 12
    for row in rows:
        nodes = parse_path(row["generated"])
        assert row["correct"] == (nodes is not None and is_shortest_path(row["sample"], nodes))
    settings, _ = preset_settings("tiny")
    expected = generate_pathfinding(6, seed=0, stream="eval", **settings)
    assert [r["prompt"] for r in rows[:6]] == [r["question"] for r in expected]
    assert [r["gold"] for r in rows[:6]] == [r["answer"] for r in expected]


def test_the_release_files_train_and_a_bad_row_stops_the_run_before_training(tmp_path: Path) -> None:
    settings, _ = preset_settings("tiny")
    data = tmp_path / "release"
    data.mkdir()
    train = generate_pathfinding(24, seed=5, stream="train", **settings)
    test = generate_pathfinding(4, seed=5, stream="eval", **settings)
    (data / "pathfinding_train.json").write_text(json.dumps(train, indent=2))
    (data / "pathfinding_test.json").write_text(json.dumps(test, indent=2))
    assert _run(tmp_path / "ok", "--data", str(data)) == 0
    golds = [json.loads(line)["gold"] for line in (tmp_path / "ok" / "predictions.jsonl").read_text().splitlines()]
    assert golds[:4] == [r["answer"] for r in test]

    bad = dict(test[1], edges=[e for e in test[1]["edges"] if e[1] != test[1]["end"]])  # the end is unreachable
    write_jsonl([test[0], bad], tmp_path / "bad.jsonl")
    out = tmp_path / "bad_run"
    assert _run(out, "--data", str(tmp_path / "bad.jsonl"), "--eval-size", "1") == 2
    assert not list(out.glob("*/final")) and not list(out.glob("*/checkpoints"))


def test_a_bad_row_is_named_with_file_and_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = generate_pathfinding(3, seed=0, stream="eval", **preset_settings("tiny")[0])
    rows[2]["edges"].append([rows[2]["start"], rows[2]["end"]])  # now the gold answer is not the shortest path
    write_jsonl(rows, tmp_path / "rows.jsonl")
    assert _run(tmp_path / "run", "--data", str(tmp_path / "rows.jsonl"), "--eval-size", "1") == 2
    assert f"{tmp_path / 'rows.jsonl'}:3: answer" in capsys.readouterr().err


def test_the_paper_preset_retrofits_the_releases_model_without_a_download() -> None:
    """The paper preset's plan names the release's hub model (nothing is loaded); a dry run sizes its shape;
    --retrofit replaces it."""
    task, tree = load(preset_config("pathfinding", "paper"), [], pathfinding.PathfindingTask)
    assert task.pretrained == "HuggingFaceTB/SmolLM2-135M" and task.arms == ("t2mlr:3-28", "transformer")
    assert pathfinding.plan("paper", task, tree).start == StartingPoint("retrofit", model=task.pretrained)
    assert pathfinding.plan("paper", task, tree, dry_run=True).start.kind == "shape"
    assert pathfinding.plan("paper", task, tree, retrofit="local/model").start.model == "local/model"
    assert (tree["model"]["l_start"], tree["model"]["l_end"], tree["model"]["base"]["num_hidden_layers"]) == (3, 28, 30)


@pytest.mark.parametrize("overrides, said", [
    (["task.start=from"], "starts from scratch or retrofits"),
    (["task.start=retrofit"], "needs task.pretrained"),
    (["task.name=prosqa-hard"], "must be one of ['pathfinding']"),
    (["task.settings.path_range=[2,3]"], "3 <= lo <= hi"),
])
def test_bad_settings_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, overrides: list[str], said: str) -> None:
    assert _run(tmp_path / "run", *overrides) == 2
    assert said in capsys.readouterr().err
