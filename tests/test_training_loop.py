"""The training loop end to end: the debug preset learns, Jacobi early stopping, middle-block
activation checkpointing, the plain-transformer baseline, logs and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from t2mlr import T2MLRConfig
from t2mlr.training.config import TrainConfig, load_config
from t2mlr.training.model_factory import build_model
from t2mlr.training.plot import plot_run
from t2mlr.training.trainer import train

TINY = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.l_start=2", "model.l_end=3", "model.d_forward=4", "model.d_backward=2",
    "data.seq_len=32", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=32", "eval.every=0",
    "train.global_batch_size=4", "train.micro_batch_size=2", "train.max_steps=2", "logging.progress_bar=false",
    "checkpoint.every=0", "checkpoint.save_final=false",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(*overrides: str) -> TrainConfig:
    return load_config("debug", TINY + list(overrides))


def tiny_plain(*overrides: str) -> TrainConfig:
    """The tiny config as a plain transformer: the T²MLR settings are not keys of that architecture."""
    from t2mlr.training.config import (
        apply_overrides,
        config_from_tree,
        load_yaml_tree,
        resolve_config_path,
    )

    tree = apply_overrides(load_yaml_tree(resolve_config_path("debug")), TINY + list(overrides))
    settings = T2MLRConfig.recurrence_fields()
    tree["model"] = {key: value for key, value in tree["model"].items() if key not in settings}
    tree["model"]["arch"] = "transformer"
    return config_from_tree(tree)


def train_records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def final_state(cfg: TrainConfig, run: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    from t2mlr.training.trainer import Trainer

    trainer = Trainer(cfg, run)
    result = trainer.train()
    return result.losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.slow
def test_debug_preset_loss_falls_well_below_start(tmp_path: Path) -> None:
    cfg = load_config("debug", ["logging.progress_bar=false", "checkpoint.every=0", "checkpoint.save_final=false"])
    result = train(cfg, tmp_path / "debug")
    assert result.step == cfg.train.max_steps <= 48
    assert result.losses[-1] < 0.5 * result.losses[0], result.losses
    log = (tmp_path / "debug" / "train.log").read_text()
    assert "train forward path: jacobi (d_forward=4, d_backward=2" in log
    assert "eval forward path: exact" in log
    assert result.eval_metrics["eval_recurrence"] == "exact"
    assert result.eval_metrics["eval_loss"] < 0.6 * result.losses[0]


def test_model_early_stop_at_zero_tolerance_equals_fixed_depth() -> None:
    cfg = tiny()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    ids = torch.randint(0, 32, (2, 32))
    fixed = model(ids, labels=ids, recurrence="jacobi", jacobi_tol=None)
    stopped = model(ids, labels=ids, recurrence="jacobi", jacobi_tol=0.0)
    assert fixed.jacobi_iterations == stopped.jacobi_iterations == cfg.model.d_forward
    assert torch.equal(fixed.logits, stopped.logits) and torch.equal(fixed.loss, stopped.loss)


def test_trainer_early_stop_at_zero_tolerance_equals_fixed_depth(tmp_path: Path) -> None:
    fixed_losses, fixed_w = final_state(tiny("model.jacobi_tol=null"), tmp_path / "fixed")
    tol_losses, tol_w = final_state(tiny("model.jacobi_tol=0"), tmp_path / "tol0")
    assert fixed_losses == tol_losses
    for name in fixed_w:
        assert torch.equal(fixed_w[name], tol_w[name]), name
    assert [r["jacobi_iterations"] for r in train_records(tmp_path / "tol0")] == [4, 4]


def test_loose_tolerance_stops_early_and_is_logged(tmp_path: Path) -> None:
    train(tiny("model.jacobi_tol=1e9", "model.d_backward=1"), tmp_path / "loose")
    iterations = [r["jacobi_iterations"] for r in train_records(tmp_path / "loose")]
    assert all(it < 4 for it in iterations), iterations


def test_middle_block_activation_checkpointing_changes_nothing_numerically(tmp_path: Path) -> None:
    plain_losses, plain_w = final_state(tiny(), tmp_path / "plain")
    cfg = tiny("model.activation_checkpointing=true")
    model = build_model(cfg.model)
    assert [getattr(layer, "gradient_checkpointing", False) for layer in model.model.layers] == [False, True, True]
    ckpt_losses, ckpt_w = final_state(cfg, tmp_path / "ckpt")
    assert ckpt_losses == pytest.approx(plain_losses, rel=1e-6)
    for name in plain_w:
        torch.testing.assert_close(ckpt_w[name], plain_w[name], rtol=1e-5, atol=1e-6, msg=name)


def test_plain_transformer_baseline_trains_and_plots(tmp_path: Path) -> None:
    result = train(tiny_plain("train.max_steps=3"), tmp_path / "base")
    records = train_records(tmp_path / "base")
    assert [r["recurrence"] for r in records] == ["none"] * 3
    assert "gamma_cur" not in records[0] and records[0]["jacobi_iterations"] is None
    assert len(result.losses) == 3
    png = plot_run(tmp_path / "base")
    assert png.is_file() and png.stat().st_size > 1000


def test_metrics_record_gates_lr_and_plot(tmp_path: Path) -> None:
    train(tiny("train.max_steps=3", "schedule.warmup_steps=2"), tmp_path / "run")
    records = train_records(tmp_path / "run")
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "gamma_cur", "gamma_rec", "jacobi_iterations"):
        assert all(key in r for r in records), key
    assert records[0]["lr"] == pytest.approx(0.5 * 3e-3)
    assert records[0]["gamma_cur"] != 0.0  # the gates receive gradients from the first step
    assert plot_run(tmp_path / "run", tmp_path / "out.png").is_file()


def test_tensorboard_is_optional(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    train(tiny("train.max_steps=1", "logging.tensorboard=true"), tmp_path / "tb")
    assert any((tmp_path / "tb" / "tensorboard").iterdir())


def test_a_time_budget_ends_the_run_as_finished_at_the_step_that_spends_it(tmp_path: Path) -> None:
    """train.max_seconds: the run stops after the first step whose summed step time reaches the budget (not
    before it, not later), writes its final model and says so in its last record; a longer budget resumes it."""
    run = tmp_path / "run"
    result = train(tiny("train.max_steps=100000", "train.max_seconds=0.5", "logging.every=1000",
                        "checkpoint.save_final=true"), run)
    records = train_records(run)
    assert 1 < result.step < 100000 and (run / "final").is_dir()
    assert records[-1]["step"] == result.step and records[-1]["step_seconds"] >= 0.5
    assert result.step_seconds - records[-1]["step_seconds"] == 0  # the last step is the one recorded
    resumed = train(tiny("train.max_steps=100000", "train.max_seconds=1.0", "logging.every=1000",
                         "checkpoint.save_final=true"), run, resume=True)
    assert resumed.step > result.step and resumed.step_seconds >= 1.0


@pytest.mark.parametrize("budget", ["0", "-1", "nan"])
def test_a_time_budget_must_be_positive(budget: str) -> None:
    from t2mlr.training.config import ConfigError

    with pytest.raises(ConfigError, match="train.max_seconds must be > 0"):
        tiny(f"train.max_seconds={budget}")
