"""Run logs: metrics.jsonl (one JSON record per line), a text log, optional TensorBoard.

Records carry `"split": "train"` or `"split": "eval"`. On resume, records past the checkpoint's step
(written after the last checkpoint by the interrupted run) are dropped, so the file reads as one
uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"


def setup_logging(out_dir: Path | None, is_main: bool) -> None:
    """INFO to stderr (and train.log) on rank 0; warnings only on other ranks."""
    root = logging.getLogger("t2mlr")
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    for handler in list(root.handlers):
        if getattr(handler, "_t2mlr", False):
            root.removeHandler(handler)
            handler.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if out_dir is not None and is_main:
        handlers.append(logging.FileHandler(out_dir / LOG_FILE, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(fmt)
        handler._t2mlr = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.propagate = False


def _clean(value: Any) -> Any:
    """JSON-safe numbers: NaN/inf become strings instead of invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    """Appends records to metrics.jsonl (rank 0 only) and mirrors scalars to TensorBoard if enabled."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool = False) -> None:
        self.path = out_dir / METRICS_FILE
        self.enabled = enabled
        self._tb = None
        if enabled and tensorboard:
            self._tb = _open_tensorboard(out_dir / "tensorboard")

    def truncate_after(self, step: int) -> None:
        """Drop records with step > `step` (left by a run that died after its last checkpoint)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        if self._tb is not None:
            split = record.get("split", "train")
            for key, value in record.items():
                if key not in ("step", "split") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{split}/{key}", value, record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _open_tensorboard(folder: Path) -> Any:
    """Imported only when enabled, so TensorBoard stays an optional dependency."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise RuntimeError("logging.tensorboard=true needs the tensorboard package: pip install tensorboard") from err
    return SummaryWriter(log_dir=str(folder))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def optimizer_step_seconds(records: Iterable[dict[str, Any]]) -> float:
    """Seconds the optimizer steps took, from a run's records (`read_metrics`): checkpoints, evaluation and pauses
    between resumed attempts left out, so an interrupted and resumed run reads as one uninterrupted run. The last
    train record's `step_seconds` (the trainer's running total, kept in its checkpoints) where it has one; records of
    older versions lack it, and there each logged step's tokens/s over the tokens since the record before gives an
    estimate."""
    train = [record for record in records if record.get("split") == "train"]
    if train and "step_seconds" in train[-1]:
        return float(train[-1]["step_seconds"])
    seconds, seen = 0.0, 0
    for record in train:
        seconds += (record["tokens_seen"] - seen) / record["tokens_per_s"]
        seen = record["tokens_seen"]
    return seconds


def values_at_steps(curve: Iterable[tuple[int, float]], steps: Iterable[int]) -> list[float]:
    """A logged (step, value) curve read at other steps (an evaluation's, say): each step's own value, else the
    last one logged before it (0 before the first). Tokens and step seconds only grow, so this is what they were."""
    known = sorted(curve)
    values = []
    for step in steps:
        earlier = [value for logged, value in known if logged <= step]
        values.append(earlier[-1] if earlier else 0)
    return values
