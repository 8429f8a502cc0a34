"""The S5 experiment resumes mid-training to the same numbers, and its worker processes die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from t2mlr.experiments import s5
from t2mlr.experiments.s5 import RESULTS_JSON
from t2mlr.experiments.sections import preset_config
from t2mlr.training.checkpoint import LATEST, MODEL_FILE, load_weights
from t2mlr.training.config import load_sections
from t2mlr.training.trainer import Trainer

SRC = Path(__file__).resolve().parents[1] / "src"
MODELS = ("t2mlr", "transformer", "lstm")
TRAIN_STEP = Trainer.train_step


def run_experiment(out: Path, steps: int, checkpoint_every: int = 0, **options) -> list:
    overrides = [f"train.max_steps={steps}", f"task.baseline_steps={steps}", f"checkpoint.every={checkpoint_every}",
                 "train.device=cpu"]
    tree, sections = load_sections(preset_config("s5", "tiny"), overrides, {"task": s5.S5Task})
    return s5.run("tiny", sections["task"], tree, out, **options)


class Interrupted(Exception):
    """Stands for a Ctrl-C or a kill right after a checkpoint was written."""


def _per_n(out: Path) -> dict[str, dict]:
    return {m["name"]: m["per_n"] for m in json.loads((out / RESULTS_JSON).read_text())["models"]}


def _final_weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    checkpoints = out / name / "checkpoints"
    return load_weights(checkpoints / (checkpoints / LATEST).read_text().strip() / MODEL_FILE)


def _assert_same_runs(out: Path, reference: Path, names: tuple[str, ...]) -> None:
    assert _per_n(out) == _per_n(reference)
    for name in names:
        got, expected = _final_weights(out, name), _final_weights(reference, name)
        assert got.keys() == expected.keys()
        for key in expected:
            assert torch.equal(got[key], expected[key]), f"{name}: {key} differs"


def _interrupt_at(monkeypatch, model: str, step: int) -> None:
    """The next run of `model` stops during optimizer step `step` (1-based), as a Ctrl-C or a kill would."""
    train_step = TRAIN_STEP  # not an earlier patch

    def step_then_stop(trainer: Trainer, micro_batches):
        if trainer.out_dir.name == model and trainer.step + 1 == step:
            raise Interrupted(f"{model} at step {step}")
        return train_step(trainer, micro_batches)

    monkeypatch.setattr(Trainer, "train_step", step_then_stop)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.slow
def test_resume_continues_mid_training_to_the_same_numbers(tmp_path, monkeypatch) -> None:
    # checkpoints at 8, 16, 24; metrics every 10 steps (and the last): a stop at step 23 leaves step 20's
    # record past the step-16 checkpoint, which the resumed run must cut and write again
    reference = tmp_path / "straight"
    run_experiment(reference, 25, 8, workers=1)

    out = tmp_path / "stopped"
    _interrupt_at(monkeypatch, "t2mlr", 23)  # T²MLR stops mid-run, the others never start
    with pytest.raises(Interrupted):
        run_experiment(out, 25, 8, workers=1)
    assert not (out / "transformer").exists()
    _interrupt_at(monkeypatch, "transformer", 12)  # resumed: T²MLR finishes, the Transformer stops
    with pytest.raises(Interrupted):
        run_experiment(out, 25, 8, workers=1, resume=True)
    monkeypatch.undo()
    assert "resumed from" in (out / "t2mlr" / "train.log").read_text()
    assert "step_00000016" in (out / "t2mlr" / "train.log").read_text()  # its latest checkpoint before step 23
    assert _checkpoint_step(out / "transformer") == 8
    run_experiment(out, 25, 8, workers=1, resume=True)
    assert "resumed from" in (out / "transformer" / "train.log").read_text()
    _assert_same_runs(out, reference, MODELS)
    for name in MODELS:
        steps = [json.loads(line)["step"] for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert steps == [10, 20, 25]  # the records past a checkpoint were cut, not repeated


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.slow
def test_checkpoints_change_no_number(tmp_path) -> None:
    run_experiment(tmp_path / "final_only", 5, workers=1, models=("t2mlr",))
    run_experiment(tmp_path / "every_step", 5, 1, workers=1, models=("t2mlr",))
    _assert_same_runs(tmp_path / "every_step", tmp_path / "final_only", ("t2mlr",))


def test_the_cpu_preset_checkpoints_periodically() -> None:
    tree, sections = load_sections(preset_config("s5", "cpu"), [], {"task": s5.S5Task})
    every = tree["checkpoint"]["every"]
    assert 0 < every <= 500 and tree["train"]["max_steps"] > every and sections["task"].baseline_steps > every


# ------------------------------------------------------------------------------------ a real kill -9


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for a reaper that may never come in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _experiment(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "t2mlr", "experiment", "s5-retrieval", "--preset", "tiny", "--device", "cpu",
            "--out", str(out), "--models", "transformer", "lstm", "--workers", "2", "--threads", "2",
            "--checkpoint-every", "5", *extra]


def _checkpoint_step(run_dir: Path) -> int:
    latest = run_dir / "checkpoints" / LATEST
    return int(latest.read_text().split("_")[-1]) if latest.is_file() else 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_parent_ends_its_workers(tmp_path) -> None:
    out = tmp_path / "killed"
    command = _experiment(out, "--steps", "100000")  # far more than the test waits for: the workers are mid-run
    parent = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(SRC)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not all(_checkpoint_step(out / name) > 0 for name in ("transformer", "lstm")):
            assert parent.poll() is None and time.monotonic() < deadline, "no checkpoint from both workers"
            time.sleep(0.05)
        children = [pid for pid in _children(parent.pid) if _running(pid)]
        parent.kill()  # SIGKILL: the parent gets no chance to clean up
        parent.wait()
    finally:
        if parent.poll() is None:
            parent.kill()
    assert len(children) >= 2  # the two workers (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in children if _running(pid)]
    for pid in survivors:  # never leave them training, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], "worker processes outlived their parent"
