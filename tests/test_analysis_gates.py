"""`t2mlr analyze gates`: reads the gates that runs logged in metrics.jsonl, plots them, and says so
clearly when a run has none (a plain Transformer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t2mlr.analysis.gates import gate_trajectory
from t2mlr.cli import main


def _run(directory: Path, gates: list[tuple[float, float]] | None, eval_every: int = 0) -> Path:
    """A run directory with a metrics.jsonl as the trainer writes it (train records; eval records without gates)."""
    directory.mkdir(parents=True)
    records = []
    for step in range(1, (len(gates) if gates else 4) + 1):
        record = {"split": "train", "step": step, "loss": 3.0 - 0.1 * step, "recurrence": "jacobi" if gates else "none"}
        if gates:
            record["gamma_cur"], record["gamma_rec"] = gates[step - 1]
        records.append(record)
        if eval_every and step % eval_every == 0:
            records.append({"split": "eval", "step": step, "eval_loss": 3.1})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return directory


def test_trajectory_reads_train_records_in_order(tmp_path) -> None:
    run = _run(tmp_path / "a", [(0.0, 0.0), (-0.01, 0.02), (-0.03, 0.05)], eval_every=2)
    trajectory = gate_trajectory(run)
    assert trajectory.steps == [1, 2, 3]
    assert trajectory.gamma_cur == [0.0, -0.01, -0.03] and trajectory.gamma_rec == [0.0, 0.02, 0.05]
    assert trajectory.matches_paper()
    assert gate_trajectory(_run(tmp_path / "plain", None)) is None


def test_command_plots_runs_and_lists_a_run_without_gates(tmp_path, capsys) -> None:
    paper_like = _run(tmp_path / "t2mlr", [(0.0, 0.0), (-0.02, 0.01), (-0.05, 0.04)])
    opposite = _run(tmp_path / "other", [(0.0, 0.0), (0.01, -0.01)])
    plain = _run(tmp_path / "transformer", None)
    out = tmp_path / "out"
    code = main(["analyze", "gates", str(paper_like), str(opposite), str(plain), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    for name in ("gates.md", "gates.json", "gates.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "gates.json").read_text())
    assert [r["matches_paper"] for r in payload["runs"]] == [True, False]
    assert payload["runs"][0]["final_gamma_cur"] == pytest.approx(-0.05)
    assert len(payload["skipped"]) == 1 and "plain Transformer" in payload["skipped"][0]
    assert "transformer" in (out / "gates.md").read_text()


def test_only_runs_without_gates_is_a_clear_error(tmp_path, capsys) -> None:
    plain = _run(tmp_path / "transformer", None)
    code = main(["analyze", "gates", str(plain), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "no run has fusion gates" in err and "plain Transformer" in err


def test_a_missing_metrics_file_is_named(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["analyze", "gates", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_labels_name_the_runs_and_must_match_their_count(tmp_path, capsys) -> None:
    first = _run(tmp_path / "a", [(0.0, 0.0), (-0.01, 0.02)])
    second = _run(tmp_path / "b", [(0.0, 0.0), (0.03, -0.01)])
    plain = _run(tmp_path / "transformer", None)
    out = tmp_path / "out"
    code = main(["analyze", "gates", str(first), str(second), str(plain), "--labels", "Jacobi 16:4", "exact bptt 4",
                 "Transformer",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "gates.json").read_text())
    assert [r["run"] for r in payload["runs"]] == ["Jacobi 16:4", "exact bptt 4"]
    assert "| `Jacobi 16:4` | 2 | -0.0100 | +0.0200 |" in (out / "gates.md").read_text()
    code = main(["analyze", "gates", str(first), str(second), "--labels", "T²MLR(2,3)", "Transformer", "--out", str(out)])
    assert code == 0 and [r["run"] for r in json.loads((out / "gates.json").read_text())["runs"]] == ["T²MLR(2,3)", "Transformer"]
    code = main(["analyze", "gates", str(first), str(second), "--labels", "Jacobi (16,4)", "--out", str(out)])
    assert code == 2 and "1 names for 2 runs" in capsys.readouterr().err
