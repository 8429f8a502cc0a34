"""torchrun with 2 processes on gloo: DDP and FSDP2 match one process on the same global batch.

Each case launches `python -m torch.distributed.run --nproc_per_node 2 -m t2mlr.training train ...`
in a subprocess and compares its metrics and final weights with an in-process single-rank run.
The FSDP case also stops after 2 steps and resumes (sharded state → full checkpoint → resharded).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from t2mlr.training import checkpoint as ckpt
from t2mlr.training.config import load_config
from t2mlr.training.trainer import train

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = [
    "model.base.hidden_size=32", "model.base.intermediate_size=64", "model.base.num_hidden_layers=3",
    "model.base.vocab_size=32", "model.l_start=2", "model.l_end=2", "model.d_forward=3", "model.d_backward=2",
    "data.seq_len=16", "data.kwargs.vocab_size=32", "data.kwargs.num_samples=64", "data.kwargs.min_doc_len=3",
    "data.kwargs.max_doc_len=10", "eval.data.seq_len=16", "eval.data.kwargs.vocab_size=32", "eval.max_batches=2",
    "eval.batch_size=4", "eval.every=3", "optim.lr=1e-2", "schedule.warmup_steps=1",
    "schedule.total_steps=3", "train.global_batch_size=8", "checkpoint.every=0", "logging.progress_bar=false",
]
PER_RANK = ["train.micro_batch_size=2"]  # 2 ranks × 2 × accumulation 2 = 8
SINGLE = ["train.micro_batch_size=4"]  # 1 rank × 4 × accumulation 2 = 8: the same samples per micro-step


def torchrun(out: Path, parallel: str, *extra: str, config: str = "debug", overrides: list[str] = TINY) -> str:
    """Run a config (default: the debug preset with `TINY`) on 2 ranks; returns the launcher's stderr
    (warnings included)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "t2mlr.training", "train", config, "--out", str(out), "--parallel", parallel,
           *overrides, *PER_RANK, *extra]
    # Own session, so a timeout can end the launcher *and* its workers (they would outlive a plain kill).
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return stderr


def records(run: Path, split: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config("debug", TINY + SINGLE + ["train.max_steps=3"]), out)
    finally:
        torch.set_num_threads(threads)
    return out


def assert_same_run(run: Path, reference: Path) -> None:
    ref_train, got_train = records(reference, "train"), records(run, "train")
    assert [r["step"] for r in got_train] == [1, 2, 3]
    for key in ("loss", "grad_norm", "gamma_cur", "gamma_rec", "lr"):
        assert [r[key] for r in got_train] == pytest.approx([r[key] for r in ref_train], rel=1e-5, abs=1e-7), key
    assert [r["jacobi_iterations"] for r in got_train] == [3, 3, 3]
    assert records(run, "eval")[0]["eval_loss"] == pytest.approx(records(reference, "eval")[0]["eval_loss"], rel=1e-5)
    ref_w = ckpt.load_weights(reference / "checkpoints" / "step_00000003" / ckpt.MODEL_FILE)
    got_w = ckpt.load_weights(run / "checkpoints" / "step_00000003" / ckpt.MODEL_FILE)
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_ddp_two_ranks_match_single_process(tmp_path: Path, single_run: Path) -> None:
    torchrun(tmp_path / "ddp", "ddp", "train.max_steps=3")
    assert_same_run(tmp_path / "ddp", single_run)


@pytest.mark.slow
def test_fsdp_two_ranks_match_single_process_across_resume(tmp_path: Path, single_run: Path) -> None:
    run = tmp_path / "fsdp"
    stderr = torchrun(run, "fsdp", "train.max_steps=2")
    torchrun(run, "fsdp", "train.max_steps=3", "--resume")
    assert_same_run(run, single_run)
    assert "returned a view tensor" not in stderr  # the model returns no views for FSDP2 to warn about
    assert "parallel fsdp × 2 rank(s)" in (run / "train.log").read_text()


@pytest.mark.slow
def test_fsdp_with_the_one_pass_replay_backward_matches_single_process(tmp_path: Path) -> None:
    """Exact-path training with a BPTT window replays the exact states with `FixedPointBackward`, whose
    backward runs nested autograd passes through the sharded middle block: FSDP2's hooks must survive them."""
    extra = ["model.train_recurrence=exact", "model.bptt_window=2", "train.max_steps=2"]
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config("debug", TINY + SINGLE + extra), single)
    finally:
        torch.set_num_threads(threads)
    torchrun(tmp_path / "fsdp", "fsdp", *extra)
    for key in ("loss", "grad_norm", "gamma_rec"):
        assert [r[key] for r in records(tmp_path / "fsdp", "train")] == pytest.approx(
            [r[key] for r in records(single, "train")], rel=1e-5, abs=1e-7), key
