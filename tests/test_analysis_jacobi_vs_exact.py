"""`t2mlr analyze jacobi-vs-exact`: the arms' configs, and the command end to end on the debug preset made
tiny (three trainings of three steps), including refusing and resuming existing runs."""

from __future__ import annotations

import json

import pytest
import yaml
from analysis_helpers import TINY_TRAINING
from golden_experiments import ATOL, RTOL

from t2mlr.analysis.jacobi_vs_exact import training_arms
from t2mlr.baselines.matching import count_parameters
from t2mlr.cli import main
from t2mlr.training.arms import config_tree, matched_arm
from t2mlr.training.config import config_from_tree, load_yaml_tree, resolve_config_path
from t2mlr.training.model_factory import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_arms_share_everything_but_the_training_path() -> None:
    tree = config_tree("debug", ["train.max_steps=7"])
    jacobi, exact, transformer = training_arms(tree, d_forward=6, d_backward=3)
    assert (jacobi.config.model.train_recurrence, jacobi.config.model.d_forward, jacobi.config.model.d_backward) == (
        "jacobi", 6, 3)
    assert jacobi.config.model.bptt_window is None
    assert (exact.config.model.train_recurrence, exact.config.model.bptt_window) == ("exact", 3)
    for arm in (jacobi, exact, transformer):
        assert arm.config.train.max_steps == 7 and arm.config.optim == jacobi.config.optim
        assert arm.config.data == jacobi.config.data
    assert transformer.config.model.arch == "transformer"
    with pytest.raises(ValueError, match="d_backward"):
        training_arms(tree, d_forward=2, d_backward=3)


def test_the_transformer_arm_is_parameter_matched() -> None:
    tree = config_tree("debug")
    t2mlr_params = count_parameters(build_model(config_from_tree(tree).model))
    transformer = build_model(matched_arm(tree, "transformer", "transformer").config.model)
    assert count_parameters(transformer) >= t2mlr_params
    assert transformer.config.hidden_size > 64  # widened from the debug preset's 64


@pytest.mark.slow
def test_command_trains_three_arms_evaluates_both_paths_and_resumes(tmp_path, capsys) -> None:
    out = tmp_path / "jve"
    # Jacobi evaluation at depth 65 >= seq_len + 1: it must equal the exact evaluation (float32)
    args = ["analyze", "jacobi-vs-exact", "debug", *TINY_TRAINING, "--d-forward", "4", "--d-backward", "2",
            "--eval-d-forward", "65", "--out", str(out), "--threads", "1"]
    assert main(args) == 0, capsys.readouterr().err
    for name in ("jacobi_vs_exact.md", "jacobi_vs_exact.json", "jacobi_vs_exact.png"):
        assert (out / name).is_file(), name
    for arm in ("jacobi", "exact", "transformer"):
        assert (out / arm / "final" / "config.json").is_file(), arm
    payload = json.loads((out / "jacobi_vs_exact.json").read_text())
    cells = payload["cells"]
    assert set(cells) == {"transformer", "exact/exact", "exact/jacobi", "jacobi/exact", "jacobi/jacobi"}
    # evaluated deeper than the rows are long, Jacobi is the exact path: the same loss to float32 rounding, at the
    # golden experiments' tolerance for a loss (tests/golden_experiments.py)
    assert cells["jacobi/jacobi"]["loss"] == pytest.approx(cells["jacobi/exact"]["loss"], rel=RTOL, abs=ATOL)
    assert cells["exact/jacobi"]["loss"] == pytest.approx(cells["exact/exact"]["loss"], rel=RTOL, abs=ATOL)
    assert cells["jacobi/exact"]["loss"] != cells["exact/exact"]["loss"]  # two different trainings
    claims = payload["claims"]
    assert claims["train_gap"] == pytest.approx(cells["jacobi/exact"]["loss"] - cells["exact/exact"]["loss"])
    table = (out / "jacobi_vs_exact.md").read_text()
    assert "T²MLR: Jacobi train, Jacobi eval" in table and "Transformer" in table

    capsys.readouterr()
    assert main(args) == 2  # the runs exist: refused without --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0  # finished arms are only re-evaluated
    again = json.loads((out / "jacobi_vs_exact.json").read_text())["cells"]
    assert again["jacobi/exact"]["loss"] == pytest.approx(cells["jacobi/exact"]["loss"], abs=1e-7)


def test_a_config_of_a_plain_model_is_refused(tmp_path, capsys) -> None:
    tree = load_yaml_tree(resolve_config_path("debug"))
    tree["model"] = {"arch": "transformer", "base": tree["model"]["base"]}
    config = tmp_path / "plain.yaml"
    config.write_text(yaml.safe_dump(tree))
    code = main(["analyze", "jacobi-vs-exact", str(config), "--out", str(tmp_path / "out"), "--threads", "1"])
    assert code == 2
    assert "model.arch is 'transformer'" in capsys.readouterr().err
