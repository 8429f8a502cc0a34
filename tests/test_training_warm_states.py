"""Multi-epoch warm starts (`train.warm_start_states`): what is stored, that the next visit starts from it,
that repeated visits converge to the exact path's loss, and that checkpoints carry the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rounding import float32_tolerance, in_dtype

from t2mlr import T2MLRCache
from t2mlr.training.config import ConfigError, load_config
from t2mlr.training.data import Collator, build_dataset
from t2mlr.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# 4 rows of 12 tokens, all of them in every step: each step is one epoch.
SMALL = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.l_start=2", "model.l_end=2", "model.d_forward=2", "model.d_backward=1",
    "data.seq_len=12", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=4", "data.kwargs.min_doc_len=12",
    "data.kwargs.max_doc_len=12", "eval.every=0", "train.global_batch_size=4", "train.micro_batch_size=4",
    "logging.progress_bar=false", "checkpoint.every=0", "checkpoint.save_final=false", "schedule.warmup_steps=0",
    "train.warm_start_states=true",
]


def trainer_with_open_gates(out: Path, *overrides: str) -> Trainer:
    trainer = Trainer(load_config("debug", SMALL + list(overrides)), out)
    with torch.no_grad():  # at γ = 0 every Jacobi iterate is the same and warm starts would change nothing
        trainer.model.fusion.gamma_cur.fill_(0.5)
        trainer.model.fusion.gamma_rec.fill_(-0.9)
        trainer.model.fusion.w_rec.weight.mul_(10.0)
    return trainer


def all_rows(trainer: Trainer) -> dict[str, torch.Tensor]:
    dataset = build_dataset(trainer.cfg.data)
    return Collator()([dataset[i] for i in range(len(dataset))])


def exact_states_and_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float]:
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        out = model(**batch, past_key_values=cache, use_cache=True, recurrence="exact")
    return cache.recurrent_states, float(out.loss)


def test_the_option_needs_the_jacobi_path() -> None:
    with pytest.raises(ConfigError, match="train.warm_start_states"):
        load_config("debug", SMALL + ["model.train_recurrence=exact"])


def test_a_deep_first_visit_stores_the_exact_states(tmp_path: Path) -> None:
    """With d_forward ≥ T + 1 the first (cold) visit reaches the fixed point: the stored states are the exact
    path's of the weights before the update."""
    trainer = trainer_with_open_gates(tmp_path / "run", "model.d_forward=13", "train.max_steps=1")
    batch = all_rows(trainer)
    expected, _ = exact_states_and_loss(trainer.model, batch)
    # the Jacobi iterates and the exact loop are two float32 computations of the states: rounding apart
    tolerance = float32_tolerance(lambda dtype: exact_states_and_loss(in_dtype(trainer.model, dtype), batch)[0])
    trainer.train()
    stored = torch.stack([trainer.warm_states.states[i] for i in range(4)])
    torch.testing.assert_close(stored, expected, rtol=0, atol=tolerance)


def test_repeated_visits_converge_to_the_exact_loss(tmp_path: Path) -> None:
    """At (almost) fixed weights every visit adds d_forward iterates to the stored ones, so the warm-started
    loss approaches the exact path's loss, while a cold start at the same depth stays off."""
    trainer = trainer_with_open_gates(tmp_path / "warm", "optim.lr=1e-12", "train.max_steps=8")
    _, exact_loss = exact_states_and_loss(trainer.model, all_rows(trainer))
    losses = trainer.train().losses
    records = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["warm_started"] for r in records] == [0.0] + [1.0] * 7
    gaps = [abs(loss - exact_loss) for loss in losses]
    assert gaps[0] > 1e-3  # the cold first visit: two iterates from the seed are not the fixed point
    assert gaps[-1] < 1e-5 and gaps[-1] < gaps[0] / 100


def test_resume_restores_the_store(tmp_path: Path) -> None:
    straight = trainer_with_open_gates(tmp_path / "a", "train.max_steps=4").train().losses
    trainer_with_open_gates(tmp_path / "b", "train.max_steps=4").train(stop_after=2)
    assert (tmp_path / "b" / "checkpoints" / "step_00000002" / "warm_states" / "rank_00000.pt").is_file()
    resumed = Trainer(load_config("debug", SMALL + ["train.max_steps=4"]), tmp_path / "b", resume=True)  # gates from the checkpoint
    assert sorted(resumed.warm_states.states) == [0, 1, 2, 3]
    assert resumed.train().losses == pytest.approx(straight[2:], abs=0, rel=0)
