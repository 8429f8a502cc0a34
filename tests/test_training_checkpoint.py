"""Checkpoints: exact resume, crash-safe writes, non-finite loss handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from t2mlr.training import checkpoint as ckpt
from t2mlr.training.commands import main as cli_main
from t2mlr.training.config import TrainConfig, load_config
from t2mlr.training.trainer import NonFiniteLossError, Trainer, train

# A tiny Jacobi model with attention dropout, so exact resume also needs the RNG states restored.
TINY = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.base.attention_dropout=0.1", "model.l_start=2", "model.l_end=2",
    "model.d_forward=3", "model.d_backward=2", "data.seq_len=16", "data.kwargs.vocab_size=32",
    "data.kwargs.num_samples=64", "data.kwargs.min_doc_len=3", "data.kwargs.max_doc_len=10",
    "eval.data.seq_len=16", "eval.data.kwargs.vocab_size=32", "eval.max_batches=1",
    "train.global_batch_size=4", "train.micro_batch_size=2", "logging.progress_bar=false", "checkpoint.every=0",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(*overrides: str) -> TrainConfig:
    return load_config("debug", TINY + list(overrides))


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def train_losses(run: Path) -> list[float]:
    return [r["loss"] for r in metrics(run) if r["split"] == "train" and "loss" in r]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_weights(path / ckpt.MODEL_FILE)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    common = ("schedule.total_steps=10", "eval.every=3", "schedule.warmup_steps=2")
    straight = train(tiny("train.max_steps=10", *common), tmp_path / "straight")
    first = train(tiny("train.max_steps=5", *common), tmp_path / "split")
    assert first.step == 5
    second = train(tiny("train.max_steps=10", *common), tmp_path / "split", resume=True)
    assert second.step == 10
    assert train_losses(tmp_path / "split") == straight.losses
    assert straight.losses[-1] < straight.losses[0]
    a, b = weights(straight.last_checkpoint), weights(second.last_checkpoint)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    from t2mlr import T2MLRForCausalLM

    reloaded = T2MLRForCausalLM.from_pretrained(second.last_checkpoint).state_dict()
    assert all(torch.equal(reloaded[name], b[name]) for name in b), "checkpoint dirs load with from_pretrained"
    evals = [r for r in metrics(tmp_path / "split") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6, 9] and all(r["eval_recurrence"] == "exact" for r in evals)


def test_out_dir_with_checkpoints_needs_resume(tmp_path: Path) -> None:
    train(tiny("train.max_steps=1", "eval.every=0"), tmp_path / "run")
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(tiny("train.max_steps=2", "eval.every=0"), tmp_path / "run")


def test_crash_during_checkpoint_write_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    cfg = tiny("train.max_steps=4", "checkpoint.every=2", "checkpoint.save_final=false", "eval.every=0")
    real_torch_save = torch.save
    calls = {"n": 0}

    def dying_save(obj: object, path: object, *args: object, **kwargs: object) -> None:
        """The second checkpoint dies after its weights are written, mid-way through the optimizer file."""
        if Path(str(path)).name == ckpt.OPTIM_FILE:
            calls["n"] += 1
            if calls["n"] == 2:
                Path(str(path)).write_bytes(b"partial")
                raise OSError("simulated crash while writing the checkpoint")
        real_torch_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="simulated crash"):
        train(cfg, run)
    monkeypatch.setattr(torch, "save", real_torch_save)

    root = run / "checkpoints"
    assert (root / ckpt.LATEST).read_text().strip() == "step_00000002"
    assert not (root / "step_00000004").exists()
    assert list(root.glob(f"{ckpt.TMP_PREFIX}*")), "the interrupted write stays in its temporary directory"
    assert ckpt.load_weights(root / "step_00000002" / ckpt.MODEL_FILE)

    resumed = train(tiny("train.max_steps=4", "checkpoint.every=2", "eval.every=0"), run, resume=True)
    assert resumed.step == 4 and (root / ckpt.LATEST).read_text().strip() == "step_00000004"
    assert not list(root.glob(f"{ckpt.TMP_PREFIX}*")), "the next save removes stale temporary directories"
    assert [r["step"] for r in metrics(run) if r["split"] == "train"] == [1, 2, 3, 4]


def _nan_after(calls_before_nan: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the model's loss NaN from its (calls_before_nan + 1)-th training forward on."""
    from t2mlr import T2MLRForCausalLM

    real_forward = T2MLRForCausalLM.forward
    state = {"n": 0}

    def forward(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        if self.training:
            state["n"] += 1
            if state["n"] > calls_before_nan:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(T2MLRForCausalLM, "forward", forward)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    _nan_after(3, monkeypatch)  # one forward per step (micro batch = global batch): step 4 is the first NaN
    cfg = tiny("train.max_steps=6", "checkpoint.every=1", "eval.every=0", "train.micro_batch_size=4")
    trainer = Trainer(cfg, run)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at step 4.*step_00000003"):
        trainer.train()
    assert (run / "checkpoints" / ckpt.LATEST).read_text().strip() == "step_00000003"
    saved = weights(run / "checkpoints" / "step_00000003")
    for name, param in trainer.model.state_dict().items():
        assert torch.equal(param, saved[name]), f"{name} changed after the non-finite step"
    assert metrics(run)[-1]["event"] == "non_finite"


def test_cli_reports_non_finite_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    _nan_after(0, monkeypatch)
    code = cli_main(["train", "debug", "--out", str(tmp_path / "run"), *TINY, "train.max_steps=2", "eval.every=0"])
    assert code == 1
    assert "non-finite loss" in capsys.readouterr().err


def test_weights_roundtrip_keeps_tied_embeddings_once(tmp_path: Path) -> None:
    shared = torch.randn(4, 3)
    ckpt.save_weights({"embed": shared, "head": shared, "other": torch.ones(2)}, tmp_path / "w.safetensors")
    loaded = ckpt.load_weights(tmp_path / "w.safetensors")
    assert torch.equal(loaded["embed"], shared) and torch.equal(loaded["head"], shared)
