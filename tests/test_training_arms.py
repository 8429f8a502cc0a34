"""The one arms driver (t2mlr.training.arms): arms derived from one config tree, trained in turn or side by
side in worker processes, a failure raised or (keep_going) recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from t2mlr.baselines.matching import count_parameters, parse_model_spec
from t2mlr.training.arms import arm_from_tree, config_tree, matched_arm, resolve_workers, train_arms
from t2mlr.training.checkpoint import MODEL_FILE, load_weights
from t2mlr.training.metrics import optimizer_step_seconds, read_metrics
from t2mlr.training.model_factory import build_model
from t2mlr.training.trainer import NonFiniteLossError, Trainer

TINY = ["train.max_steps=2", "eval.every=0", "checkpoint.every=0", "logging.progress_bar=false",
        "data.kwargs.num_samples=32", "train.device=cpu"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_resolve_workers(monkeypatch) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert resolve_workers(None, 3, torch.device("cpu")) == 3  # one per run
    assert resolve_workers(None, 8, torch.device("cpu")) == 4  # at most one per CPU thread
    assert resolve_workers(5, 2, torch.device("cpu")) == 2  # never more workers than runs
    with pytest.raises(ValueError, match="workers must be >= 1"):
        resolve_workers(0, 3, torch.device("cpu"))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # under torchrun every rank trains each arm in turn
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_workers(None, 3, torch.device("cpu")) == 1
    with pytest.raises(ValueError, match="under torchrun: the arms train in turn"):
        resolve_workers(4, 3, torch.device("cpu"))  # asked for side by side: refused, not silently one


def test_arms_of_one_tree_differ_only_where_they_say() -> None:
    tree = config_tree("debug", TINY)
    full = arm_from_tree(tree, "full", "T²MLR(1,4)", ["model.l_start=1", "model.l_end=4"])
    middle = arm_from_tree(tree, "middle", "T²MLR(2,3)")
    assert (full.config.model.l_start, middle.config.model.l_start) == (1, 2)  # the first arm did not leak
    assert full.config.optim == middle.config.optim and full.config.data == middle.config.data
    assert tree["model"]["l_start"] == 2  # nor into the tree
    transformer = matched_arm(tree, "transformer", "transformer")
    looped = matched_arm(tree, "looped", parse_model_spec("looped:2-3:2"))
    assert transformer.config.model.arch == "transformer" and transformer.config.eval.recurrence is None
    assert looped.config.model.arch == "looped" and looped.label == "looped 2-3 ×2"
    t2mlr = count_parameters(build_model(middle.config.model))
    for baseline in (transformer, looped):  # matched: never below T²MLR's count, within 1% above it
        assert t2mlr <= count_parameters(build_model(baseline.config.model)) <= 1.01 * t2mlr


def test_activation_checkpointing_carries_to_the_baselines_that_repeat_blocks() -> None:
    """A comparison run with `model.activation_checkpointing=true` keeps it on the looped arm (blocks repeat) and
    leaves it off the Transformer arm, whose architecture refuses it (nothing would be saved)."""
    tree = config_tree("debug", [*TINY, "model.activation_checkpointing=true"])
    looped = matched_arm(tree, "looped", parse_model_spec("looped:2-3:2"))
    transformer = matched_arm(tree, "transformer", "transformer")
    assert looped.config.model.activation_checkpointing and not transformer.config.model.activation_checkpointing


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_weights(checkpoint / MODEL_FILE)


def _arms() -> list:
    tree = config_tree("debug", TINY)
    return [arm_from_tree(tree, "middle", "middle", threads=1),
            arm_from_tree(tree, "full", "full", ["model.l_start=1", "model.l_end=4"], directory="t2mlr_full", threads=1)]


@pytest.mark.slow
def test_worker_processes_train_what_one_process_trains(tmp_path) -> None:
    alone, _ = train_arms(_arms(), tmp_path / "alone", workers=1)
    side_by_side, failed = train_arms(_arms(), tmp_path / "side", workers=2)
    assert set(alone) == set(side_by_side) == {"middle", "full"} and failed == {}
    assert side_by_side["full"].run_dir == tmp_path / "side" / "t2mlr_full"
    for name in alone:
        expected, got = _weights(alone[name].checkpoint), _weights(side_by_side[name].checkpoint)
        assert expected.keys() == got.keys()
        assert all(torch.equal(got[key], expected[key]) for key in expected), name  # one thread each: bit for bit
        assert side_by_side[name].model_dir.is_dir()
        # the trainer's optimizer-step total, as the run's last step record has it
        assert side_by_side[name].seconds == optimizer_step_seconds(read_metrics(side_by_side[name].run_dir)) > 0


@pytest.mark.slow
def test_a_failing_run_raises_in_the_caller(tmp_path) -> None:
    (tmp_path / "middle").write_text("a file where the run directory should go\n")
    with pytest.raises(FileExistsError):
        train_arms(_arms(), tmp_path, workers=2)
    assert (tmp_path / "t2mlr_full" / "checkpoints").is_dir()  # the run already under way was left to finish


def test_keep_going_records_a_non_finite_loss_and_trains_the_rest(tmp_path, monkeypatch) -> None:
    step = Trainer.train_step

    def failing(trainer: Trainer, micro_batches):
        if trainer.out_dir.name == "middle":
            raise NonFiniteLossError("loss nan (injected)")
        return step(trainer, micro_batches)

    monkeypatch.setattr(Trainer, "train_step", failing)
    trained, failed = train_arms(_arms(), tmp_path, keep_going=True)
    assert list(trained) == ["full"] and "loss nan" in failed["middle"]
    with pytest.raises(NonFiniteLossError):
        train_arms(_arms()[:1], tmp_path / "again")
