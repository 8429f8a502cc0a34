"""Training an experiment's runs side by side in worker processes (t2mlr.experiments.concurrent_runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from t2mlr.experiments.concurrent_runs import RunJob, resolve_workers, train_runs
from t2mlr.experiments.s5_presets import get_preset
from t2mlr.experiments.s5_retrieval import model_sections, prepare_data, train_config
from t2mlr.training.checkpoint import MODEL_FILE, load_weights

NAMES = ("transformer", "lstm")


def test_resolve_workers(monkeypatch) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert resolve_workers(None, 3, torch.device("cpu")) == 3  # one per run
    assert resolve_workers(None, 8, torch.device("cpu")) == 4  # at most one per CPU thread
    assert resolve_workers(None, 3, torch.device("cuda")) == 1  # a GPU trains one run at a time
    assert resolve_workers(5, 2, torch.device("cpu")) == 2  # never more workers than runs
    with pytest.raises(ValueError, match="workers must be >= 1"):
        resolve_workers(0, 3, torch.device("cpu"))


def _jobs(root: Path) -> list[RunJob]:
    preset = get_preset("tiny")
    tokenizer, _ = prepare_data(preset, root / "data")
    sections, _ = model_sections(preset, tokenizer)
    return [RunJob(name, train_config(preset, name, sections[name], root / "data" / "tokenizer", "cpu"), root / name)
            for name in NAMES]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_weights(checkpoint / MODEL_FILE)


def test_worker_processes_train_what_one_process_trains(tmp_path) -> None:
    alone = train_runs(_jobs(tmp_path / "alone"), workers=1)
    side_by_side = train_runs(_jobs(tmp_path / "side"), workers=2)
    assert set(alone) == set(side_by_side) == set(NAMES)
    for name in NAMES:
        assert side_by_side[name].checkpoint.is_relative_to(tmp_path / "side" / name)
        expected, got = _weights(alone[name].checkpoint), _weights(side_by_side[name].checkpoint)
        assert expected.keys() == got.keys()
        for key in expected:  # the same seeded run; only the thread count (float summation order) differs
            torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5)
        assert side_by_side[name].seconds > 0


def test_a_failing_run_raises_in_the_caller(tmp_path) -> None:
    jobs = _jobs(tmp_path)
    jobs[0].run_dir.write_text("a file where the run directory should go\n")
    with pytest.raises(FileExistsError):
        train_runs(jobs, workers=2)
    assert (jobs[1].run_dir / "checkpoints").is_dir()  # the run already under way was left to finish
