"""Sampled Jacobi depth per training step (`model.d_forward_sampling`): the config language and its refusals, a
draw that depends on the seed and the step only (so resume replays it), the drawn depth reaching the forward and
the metrics, and the dry run sized at the largest depth."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from t2mlr.cli import main as cli_main
from t2mlr.training.config import ConfigError, DepthSamplingConfig, load_config
from t2mlr.training.sizing import size_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.l_start=2", "model.l_end=2", "model.d_forward=4", "model.d_backward=2",
    "data.seq_len=16", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=64", "eval.data.seq_len=16",
    "eval.data.kwargs.vocab_size=32", "eval.every=0", "train.global_batch_size=4", "train.micro_batch_size=2",
    "train.max_steps=6", "schedule.warmup_steps=2", "logging.progress_bar=false", "checkpoint.every=3",
    "checkpoint.keep_last=0",
]
CHOICE = "model.d_forward_sampling={kind: choice, values: [1, 3, 4]}"


def train_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def run(out: Path, *extra: str) -> int:
    return cli_main(["train", "debug", "--out", str(out), *TINY, *extra, "--threads", "1"])


@pytest.mark.parametrize("sampling, depths", [
    ({"kind": "uniform", "min": 2}, [2, 3, 4, 5, 6]),
    ({"kind": "uniform"}, [1, 2, 3, 4, 5, 6]),
    ({"kind": "choice", "values": [6, 2, 4]}, [2, 4, 6]),
])
def test_the_config_language_names_the_depths(sampling: dict, depths: list[int]) -> None:
    cfg = load_config("debug", [f"model.d_forward_sampling={json.dumps(sampling)}", "model.d_forward=6"])
    assert cfg.model.d_forward_sampling.depths(6) == depths
    assert cfg.model.to_tree()["d_forward_sampling"] == {"kind": "uniform", "min": None, "values": None} | sampling


@pytest.mark.parametrize("override, message", [
    ("model.d_forward_sampling={kind: uniform, min: 0}", r"min 0 is outside 1\.\.4 \(model.d_forward\)"),
    ("model.d_forward_sampling={kind: uniform, min: 5}", r"min 5 is outside 1\.\.4"),
    ("model.d_forward_sampling={kind: choice, values: [2, 8]}", r"values \[8\] are outside 1\.\.4"),
    ("model.d_forward_sampling={kind: choice, values: [2, 2]}", "name a depth twice"),
    ("model.d_forward_sampling={kind: choice}", "kind choice needs values"),
    ("model.d_forward_sampling={kind: choice, values: [2], min: 1}", "min belongs to kind uniform"),
    ("model.d_forward_sampling={kind: unifrom}", r"must be one of \['uniform', 'choice'\]"),
    ("model.d_forward_sampling={kind: uniform, mn: 2}", "Did you mean 'min'"),
])
def test_bad_settings_are_refused_with_the_valid_range(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("debug", [override])


def test_only_a_jacobi_trained_t2mlr_samples_its_depth() -> None:
    with pytest.raises(ConfigError, match="needs model.arch t2mlr with model.train_recurrence jacobi"):
        load_config("debug", ["model.train_recurrence=exact", CHOICE])


def test_a_bad_range_exits_2_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run(tmp_path / "run", "model.d_forward_sampling={kind: uniform, min: 9}") == 2
    assert "min 9 is outside 1..4" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_draw_is_a_function_of_seed_and_step() -> None:
    sampling = DepthSamplingConfig(kind="choice", values=[1, 3, 4])
    draws = [sampling.draw(4, seed=0, step=step) for step in range(1, 601)]
    assert draws == [sampling.draw(4, seed=0, step=step) for step in range(1, 601)]
    assert draws != [sampling.draw(4, seed=1, step=step) for step in range(1, 601)]
    counts = Counter(draws)
    assert set(counts) == {1, 3, 4} and all(150 <= n <= 250 for n in counts.values())  # each about a third


def test_each_step_trains_at_its_drawn_depth_and_logs_it(tmp_path: Path) -> None:
    """The drawn depth reaches the forward (the iterations it reports) and metrics.jsonl; the first step's loss
    equals that of a run whose fixed depth is the drawn one (d_backward capped by it)."""
    assert run(tmp_path / "sampled", CHOICE) == 0
    records = train_records(tmp_path / "sampled")
    sampling = DepthSamplingConfig(kind="choice", values=[1, 3, 4])
    drawn = [sampling.draw(4, seed=0, step=step) for step in range(1, 7)]
    assert [r["d_forward"] for r in records] == drawn
    assert [r["jacobi_iterations"] for r in records] == drawn  # jacobi_tol null: every iteration runs
    first = drawn[0]
    assert run(tmp_path / "fixed", f"model.d_forward={first}", f"model.d_backward={min(2, first)}",
               "train.max_steps=1") == 0
    fixed = train_records(tmp_path / "fixed")[0]
    assert "d_forward" not in fixed
    assert records[0]["loss"] == pytest.approx(fixed["loss"], rel=1e-6, abs=1e-7)


def test_a_resumed_run_draws_and_trains_as_an_uninterrupted_one(tmp_path: Path) -> None:
    assert run(tmp_path / "straight", CHOICE) == 0
    assert run(tmp_path / "resumed", CHOICE, "--stop-after", "3") == 0
    assert run(tmp_path / "resumed", CHOICE, "--resume") == 0
    straight, resumed = train_records(tmp_path / "straight"), train_records(tmp_path / "resumed")
    assert [r["d_forward"] for r in resumed] == [r["d_forward"] for r in straight]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=1e-6)


def test_the_dry_run_sizes_the_largest_depth() -> None:
    """Values [1, 3] under d_forward 8 size as d_forward 3 (d_backward capped at 3), the same figures as a fixed
    depth of 3; uniform sampling sizes at d_forward itself."""
    sampled = load_config("debug", ["model.d_forward=8", "model.d_forward_sampling={kind: choice, values: [1, 3]}"])
    fixed = load_config("debug", ["model.d_forward=3"])
    uniform = load_config("debug", ["model.d_forward=8", "model.d_forward_sampling={kind: uniform, min: 2}"])
    at_eight = load_config("debug", ["model.d_forward=8"])
    sizes = {name: size_run(cfg, 1, "h100") for name, cfg in
             (("sampled", sampled), ("fixed", fixed), ("uniform", uniform), ("at_eight", at_eight))}
    assert sizes["sampled"].flops_per_step == sizes["fixed"].flops_per_step
    assert sizes["sampled"].memory.peak == sizes["fixed"].memory.peak
    assert sizes["uniform"].flops_per_step == sizes["at_eight"].flops_per_step
    assert "d_forward=3" in sizes["sampled"].training_path
    assert any("sized at the largest, 3" in note for note in sizes["sampled"].notes)


def test_the_grpo_trainer_refuses_a_setting_it_would_not_use() -> None:
    from t2mlr.rl.grpo import load_grpo_config

    with pytest.raises(ConfigError, match="GRPO update replays exact states"):
        load_grpo_config("grpo_tiny", ["model.d_forward_sampling={kind: uniform}"])
