"""The recurrent-weight curriculum (`train.recurrent_weight_curriculum`): λ, the weight with which Φ reads R,
ramped over the first steps. Its values against the ramps written out by hand, the config language and its
refusals, λ scaling the R that Φ reads on every path, λ reaching training (step 2's loss) and the metrics,
and a resumed run replaying an uninterrupted one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_model
from test_training_depth_sampling import run, train_records  # the tiny run, six steps, checkpoints at 3 and 6

from t2mlr.training.config import ConfigError, RecurrentWeightCurriculum, load_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COSINE = "train.recurrent_weight_curriculum={schedule: cosine, steps: 4, start: 0.2, end: 1.0}"


@pytest.mark.parametrize("schedule, shares", [
    ("linear", [0, 0.25, 0.5, 0.75, 1, 1, 1]),
    ("cosine", [0, (1 - math.cos(math.pi / 4)) / 2, 0.5, (1 - math.cos(3 * math.pi / 4)) / 2, 1, 1, 1]),
    ("exponential", [0, 1 / 16, 1 / 4, 9 / 16, 1, 1, 1]),
    ("step", [0, 0, 1, 1, 1, 1, 1]),
])
def test_each_ramp_by_hand(schedule: str, shares: list[float]) -> None:
    curriculum = RecurrentWeightCurriculum(schedule=schedule, steps=4, start=0.2, end=0.6)
    assert [curriculum.value(step) for step in range(1, 8)] == pytest.approx([0.2 + 0.4 * s for s in shares])


@pytest.mark.parametrize("override, message", [
    ("train.recurrent_weight_curriculum={steps: 0}", "steps must be >= 1"),
    ("train.recurrent_weight_curriculum={schedule: cosin, steps: 3}", r"must be one of \['linear', 'cosine'"),
    ("train.recurrent_weight_curriculum={steps: 3, stat: 0.1}", "Did you mean 'start'"),
    ("train.recurrent_weight_curriculum={steps: 3, end: .nan}", "end must be a finite number"),
])
def test_bad_settings_are_refused(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("debug", [override])


def test_only_a_t2mlr_has_a_recurrent_weight() -> None:
    with pytest.raises(ConfigError, match="needs model.arch t2mlr"):
        load_config("smollm2_135m_baseline", ["train.recurrent_weight_curriculum={steps: 3}"])


def test_the_model_reads_weighted_R_on_every_path() -> None:
    """λ = 0 reads no R (Φ(h, 0) for every token); λ scales R as Φ reads it, on the exact and Jacobi paths."""
    model = tiny_model()
    ids = random_ids(2, 7)
    with torch.no_grad():
        model.model.recurrent_weight = 0.0
        zero = model(ids, recurrence="exact").logits
        model.model.recurrent_weight = 0.5
        half_exact = model(ids, recurrence="exact").logits
        half_jacobi = model(ids, recurrence="jacobi", d_forward=8, d_backward=1).logits
        model.model.recurrent_weight = None
        plain = model(ids, recurrence="exact").logits
        reads_zero = model.fusion.register_forward_pre_hook(lambda _, args: (args[0], torch.zeros_like(args[1])))
        by_hand = model(ids, recurrence="exact").logits  # what λ = 0 means: Φ(h, 0) at every token
        reads_zero.remove()
    torch.testing.assert_close(zero, by_hand, rtol=0, atol=1e-12)
    torch.testing.assert_close(half_jacobi, half_exact, rtol=1e-10, atol=1e-10)
    assert (half_exact - plain).abs().max() > 1e-3 and (half_exact - zero).abs().max() > 1e-3


def test_each_step_trains_at_its_weight_and_logs_it(tmp_path: Path) -> None:
    assert run(tmp_path / "ramped", COSINE) == 0
    records = train_records(tmp_path / "ramped")
    curriculum = RecurrentWeightCurriculum(schedule="cosine", steps=4, start=0.2, end=1.0)
    assert [r["recurrent_weight"] for r in records] == pytest.approx([curriculum.value(s) for s in range(1, 7)])
    # the gates start closed, so λ first shows in step 1's gradient, i.e. in step 2's loss
    assert run(tmp_path / "plain", "--stop-after", "2") == 0
    plain = train_records(tmp_path / "plain")
    assert "recurrent_weight" not in plain[0] and plain[0]["loss"] == pytest.approx(records[0]["loss"], rel=1e-7)
    assert plain[1]["loss"] != pytest.approx(records[1]["loss"], rel=1e-6)
    held = "train.recurrent_weight_curriculum={steps: 1, start: 1.0, end: 1.0}"  # λ = 1 throughout: the plain run
    assert run(tmp_path / "one", held, "--stop-after", "2") == 0
    assert [r["loss"] for r in train_records(tmp_path / "one")] == pytest.approx([r["loss"] for r in plain], rel=1e-7)


def test_a_resumed_run_ramps_as_an_uninterrupted_one(tmp_path: Path) -> None:
    assert run(tmp_path / "straight", COSINE) == 0
    assert run(tmp_path / "resumed", COSINE, "--stop-after", "3") == 0
    assert run(tmp_path / "resumed", COSINE, "--resume") == 0
    straight, resumed = train_records(tmp_path / "straight"), train_records(tmp_path / "resumed")
    assert [r["recurrent_weight"] for r in resumed] == [r["recurrent_weight"] for r in straight]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=1e-6)
