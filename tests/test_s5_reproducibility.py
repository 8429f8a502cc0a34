"""A seed's S5 numbers do not depend on how the runs were scheduled or on the thread count of the process
that starts them: every run and the evaluation compute on the preset's fixed torch threads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from t2mlr.experiments import s5
from t2mlr.experiments.s5 import RESULTS_JSON, run_dir_name
from t2mlr.experiments.sections import preset_config
from t2mlr.training.arms import fixed_threads
from t2mlr.training.checkpoint import LATEST, MODEL_FILE, load_weights
from t2mlr.training.config import ConfigError, load_sections

MODELS = ("t2mlr", "t2mlr:1-2:jacobi:4:2", "transformer", "lstm")


def run_experiment(out: Path, steps: int, *overrides: str, **options) -> list:
    tree, sections = load_sections(preset_config("s5", "tiny"), [f"train.max_steps={steps}", f"task.baseline_steps={steps}",
                                                          "train.device=cpu", *overrides], {"task": s5.S5Task})
    return s5.run("tiny", sections["task"], tree, out, **options)


def _numbers(out: Path) -> list[dict]:
    """Everything results.json says about each model except the times."""
    models = json.loads((out / RESULTS_JSON).read_text())["models"]
    return [{k: v for k, v in m.items() if k not in ("train_seconds", "eval_seconds")} for m in models]


def _checkpoint(out: Path, name: str) -> Path:
    checkpoints = out / run_dir_name(name) / "checkpoints"
    return checkpoints / (checkpoints / LATEST).read_text().strip()


@pytest.mark.slow
def test_side_by_side_and_one_after_another_give_identical_numbers(tmp_path) -> None:
    side = tmp_path / "side_by_side"
    run_experiment(side, 6, models=MODELS, workers=2)  # spawned worker processes
    in_turn = tmp_path / "one_after_another"
    with fixed_threads(2):  # the starting process's own thread count must not reach the runs or the evaluation
        run_experiment(in_turn, 6, models=MODELS, workers=1)
        assert torch.get_num_threads() == 2  # restored after the runs
    assert json.loads((side / RESULTS_JSON).read_text())["training_workers"] == 2
    assert json.loads((in_turn / RESULTS_JSON).read_text())["training_workers"] == 1
    assert _numbers(side) == _numbers(in_turn)  # every per-N figure, exactly
    for name in MODELS:
        for out in (side, in_turn):  # what each run's trainer saw when it saved
            state = json.loads((_checkpoint(out, name) / "trainer_state.json").read_text())
            assert state["torch_threads"] == 1, (out.name, name)
        expected, got = (load_weights(_checkpoint(out, name) / MODEL_FILE) for out in (in_turn, side))
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[key], got[key]) for key in expected), name


def test_the_thread_count_and_kernels_are_recorded_and_checked(tmp_path) -> None:
    run_experiment(tmp_path / "s5", 2, models=("transformer",), workers=1)
    payload = json.loads((tmp_path / "s5" / RESULTS_JSON).read_text())
    assert payload["torch_threads"] == payload["preset"]["torch_threads"] == 1
    kernels = torch.backends.cpu.get_cpu_capability()
    assert payload["cpu_kernels"] == kernels
    report = (tmp_path / "s5" / "results.md").read_text(encoding="utf-8")
    assert "computed on 1 torch thread(s)" in report and f"with torch's {kernels} CPU kernels" in report
    with pytest.raises(ValueError, match="torch_threads must be >= 1"):
        load_sections(preset_config("s5", "tiny"), ["task.torch_threads=0"], {"task": s5.S5Task})
    with pytest.raises(ConfigError, match="Did you mean 'torch_threads'"):
        load_sections(preset_config("s5", "tiny"), ["task.torch_thread=2"], {"task": s5.S5Task})
