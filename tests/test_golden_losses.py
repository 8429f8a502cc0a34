"""The `debug` preset's first 20 training losses, checked in (tests/fixtures/debug_losses.json, recorded
before the model package was restructured): any change to what the model or the trainer computes shows
up here, in the spirit of torchtitan's loss-curve tests. The tolerance is the golden experiments' (the kernel
sets' measured spread times a margin, tests/golden_experiments.py): this curve, recorded on one machine, is
within 1.5e-7 relative of AVX2's and of the plain default kernels' (ATEN_CPU_CAPABILITY=default), 60 times
inside it, while a changed iteration, mask or schedule moves the curve by 1e-3 or more within a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from golden_experiments import ATOL, RTOL

from t2mlr.training import load_config, train

GOLDEN = Path(__file__).parent / "fixtures" / "debug_losses.json"
OVERRIDES = ["train.max_steps=20", "schedule.total_steps=40", "logging.progress_bar=false", "eval.every=0",
             "checkpoint.every=0", "checkpoint.save_final=false"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_debug_preset_reproduces_its_golden_loss_curve(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    result = train(load_config("debug", OVERRIDES), tmp_path / "run")
    assert len(golden) == len(result.losses) == 20
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(golden), rtol=RTOL, atol=ATOL)
