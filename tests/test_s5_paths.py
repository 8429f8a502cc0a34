"""S5-Retrieval: T²MLR's training path from the command line, and the arm spellings that name a path or a
training budget (t2mlr:S-E:exact, t2mlr:S-E:jacobi:F:B, transformer:compute-matched)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
import yaml

from t2mlr.baselines.matching import count_parameters, parse_model_spec
from t2mlr.experiments import s5
from t2mlr.experiments.commands import register
from t2mlr.experiments.s5 import RESULTS_JSON, steps_of
from t2mlr.experiments.sections import preset_config, presets
from t2mlr.tasks.tokenizers import build_s5_tokenizer
from t2mlr.training.config import load_sections
from t2mlr.training.model_factory import build_model

NEW_SPELLINGS = ("t2mlr:1-2:exact", "t2mlr:1-2:jacobi:16:4", "t2mlr:1-2:jacobi:4:2", "transformer:compute-matched",
                 "looped:full:3")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def _train_records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split") == "train"]


def _arms(preset: str, names: tuple[str, ...]) -> tuple[s5.S5Task, dict]:
    """The arms as the experiment builds them, on a preset's config filled in for its tokenizer."""
    tree, sections = load_sections(preset_config("s5", preset), ["train.device=cpu"], {"task": s5.S5Task})
    task = sections["task"]
    filled = s5.filled_tree(task, tree, build_s5_tokenizer(task.k, task.alphabet), "unused")
    return task, s5.build_arms(task, filled, names)


def test_preset_names_of_the_command_line_are_the_config_files() -> None:
    assert set(presets("s5")) == {"paper", "cpu", "cpu-deep", "tiny", "tiny-deep"}


def test_train_recurrence_jacobi_trains_on_the_jacobi_path(tmp_path) -> None:
    """The model itself reports the path it ran in every training step (metrics.jsonl: the trainer logs the
    `jacobi_iterations` the model's forward returned), not just the flag; results.json says so too."""
    out = tmp_path / "jacobi"
    argv = ["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(out), "--models", "t2mlr", "--steps", "3",
            "--train-recurrence", "jacobi", "--d-forward", "5", "--d-backward", "2", "--workers", "1"]
    assert _cli(argv) == 0
    records = _train_records(out / "t2mlr")
    assert records and all(r["recurrence"] == "jacobi" and r["jacobi_iterations"] == 5 for r in records)
    model = json.loads((out / RESULTS_JSON).read_text())["models"][0]
    assert (model["train_path"], model["eval_path"]) == ("Jacobi (5, 2)", "exact")
    assert yaml.safe_load((out / "t2mlr" / "config.yaml").read_text())["model"]["train_recurrence"] == "jacobi"

    default = tmp_path / "exact"  # the tiny preset's own path: exact, whose forward reports no iterations
    assert _cli(["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(default), "--models", "t2mlr",
                 "--steps", "2", "--workers", "1"]) == 0
    assert all(r["recurrence"] == "exact" and r["jacobi_iterations"] is None for r in _train_records(default / "t2mlr"))


def test_a_jacobi_arm_trains_on_its_own_path_beside_the_exact_one(tmp_path) -> None:
    out = tmp_path / "both"
    assert _cli(["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(out), "--steps", "2", "--workers", "1",
                 "--models", "t2mlr", "t2mlr:1-2:jacobi:3:1"]) == 0
    assert all(r["jacobi_iterations"] is None for r in _train_records(out / "t2mlr"))
    assert all(r["jacobi_iterations"] == 3 for r in _train_records(out / "t2mlr_1-2_jacobi_3_1"))
    paths = [(m["name"], m["train_path"]) for m in json.loads((out / RESULTS_JSON).read_text())["models"]]
    assert paths == [("t2mlr", "exact"), ("t2mlr:1-2:jacobi:3:1", "Jacobi (3, 1)")]
    assert "| Jacobi (3, 1) | exact |" in (out / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("extra, message", [
    (["--d-forward", "8"], "exact path"),  # depths without Jacobi training would change nothing: refused
    (["--train-recurrence", "jacobi", "--d-forward", "2", "--d-backward", "3"], "d-backward"),
    (["--models", "t2mlr:1-2:jacobi:4:16"], "must not exceed"),
    (["--models", "t2mlr:1-2:jacobi:4"], "t2mlr:S-E:jacobi:F:B"),
    (["--models", "t2mlr:1-2:gauss"], "unknown training path"),
    (["--models", "transformer:compute"], "unknown model"),
    (["--models", "looped:full:3:1"], "loop_blocks must be"),
])
def test_bad_paths_and_spellings_exit_2_before_any_data(tmp_path, capsys, extra, message) -> None:
    out = tmp_path / "s5"
    assert _cli(["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_compute_matched_needs_a_measured_ratio(tmp_path, capsys) -> None:
    out = tmp_path / "paper"
    assert _cli(["experiment", "s5-retrieval", "--preset", "paper", "--out", str(out),
                 "--models", "transformer:compute-matched"]) == 2
    assert "compute_matched_ratio" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("spelling", NEW_SPELLINGS)
def test_new_spellings_read_back_and_name_a_directory(spelling: str) -> None:
    spec = parse_model_spec(spelling)
    assert spec.name == spelling and parse_model_spec(spec.name) == spec
    assert ":" not in spec.dir_name


@pytest.mark.parametrize("preset_name, spellings", [
    ("tiny", NEW_SPELLINGS), ("cpu", NEW_SPELLINGS), ("cpu-deep", ("t2mlr:2-3:jacobi:16:4", "looped:2-3:3"))])
def test_every_new_arm_is_parameter_matched(preset_name: str, spellings: tuple[str, ...]) -> None:
    """Built as the experiment builds them: T²MLR arms on another path have T²MLR's count exactly, the
    baselines at least T²MLR's and within 1% of it."""
    _, arms = _arms(preset_name, ("t2mlr", *spellings))
    with torch.device("meta"):
        counts = {name: count_parameters(build_model(arm.config.model)) for name, arm in arms.items()}
    reference = counts["t2mlr"]
    for name in spellings:
        if parse_model_spec(name).kind == "t2mlr":
            assert counts[name] == reference, name
        else:
            assert reference <= counts[name] <= 1.01 * reference, name


def test_training_paths_and_compute_matched_steps_reach_the_trainer_config() -> None:
    names = ("t2mlr", "transformer", "t2mlr:1-2:jacobi:16:4", "t2mlr:1-2:exact", "transformer:compute-matched")
    task, arms = _arms("cpu", names)
    configs = {name: arm.config for name, arm in arms.items()}
    jacobi = configs["t2mlr:1-2:jacobi:16:4"].model
    assert (jacobi.train_recurrence, jacobi.d_forward, jacobi.d_backward, jacobi.eval_recurrence) == ("jacobi", 16, 4,
                                                                                                      "exact")
    assert configs["t2mlr:1-2:exact"].model.train_recurrence == "exact" == configs["t2mlr"].model.train_recurrence
    # the compute-matched arm is the matched Transformer itself, trained for T²MLR's steps × the measured ratio
    assert configs["transformer:compute-matched"].model == configs["transformer"].model
    assert configs["transformer:compute-matched"].train.max_steps == round(task.compute_matched_ratio * 3000)
    assert steps_of(task, 3000, "transformer:compute-matched") > steps_of(task, 3000, "transformer")
    assert task.compute_matched_basis  # results.md says how the count was derived


def test_results_md_says_how_the_compute_matched_steps_were_derived(tmp_path) -> None:
    out = tmp_path / "cm"
    assert _cli(["experiment", "s5-retrieval", "--preset", "tiny", "--out", str(out), "--models", "transformer",
                 "transformer:compute-matched", "--workers", "1"]) == 0
    text = (out / "results.md").read_text(encoding="utf-8")
    tiny, _ = _arms("tiny", ())
    matched_steps = steps_of(tiny, 3, "transformer:compute-matched")
    assert matched_steps == round(tiny.compute_matched_ratio * 3) == 6
    assert f"Compute-matched Transformer: {matched_steps:,} steps" in text
    assert tiny.compute_matched_basis in text
    steps = {m["name"]: m["steps"] for m in json.loads((out / RESULTS_JSON).read_text())["models"]}
    assert steps == {"transformer": 3, "transformer:compute-matched": matched_steps}
    saved = yaml.safe_load((out / "transformer_compute-matched" / "config.yaml").read_text())
    assert saved["train"]["max_steps"] == matched_steps
