"""The trainer's run log read back: optimizer-step time from metrics.jsonl, on hand-written records and
through a resume that drops the records past the last checkpoint (the study test reads real runs; the resume
tests check the trainer's own running total across an interruption)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t2mlr.training.metrics import METRICS_FILE, MetricsWriter, optimizer_step_seconds, read_metrics


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_step_time_is_each_records_tokens_over_its_rate(tmp_path: Path) -> None:
    # logged every 2 steps: 200 tokens at 100 tok/s, then 400 at 50, then 100 at 200; eval records ignored
    records = [{"split": "train", "step": 2, "tokens_seen": 200, "tokens_per_s": 100.0},
               {"split": "eval", "step": 2, "loss": 1.0},
               {"split": "train", "step": 4, "tokens_seen": 600, "tokens_per_s": 50.0},
               {"split": "train", "step": 5, "tokens_seen": 700, "tokens_per_s": 200.0}]
    _write(tmp_path / METRICS_FILE, records)
    assert optimizer_step_seconds(read_metrics(tmp_path)) == pytest.approx(2.0 + 8.0 + 0.5)


def test_a_resumed_log_reads_as_one_run(tmp_path: Path) -> None:
    """Records written after the last checkpoint (step 4) by an attempt that died are dropped on resume; the
    resumed attempt's records follow, so nothing is counted twice."""
    died = [{"split": "train", "step": s, "tokens_seen": 100 * s, "tokens_per_s": 100.0} for s in (2, 4, 6)]
    _write(tmp_path / METRICS_FILE, died)
    writer = MetricsWriter(tmp_path, enabled=True)
    writer.truncate_after(4)
    for step in (6, 8):
        writer.write({"split": "train", "step": step, "tokens_seen": 100 * step, "tokens_per_s": 200.0})
    assert optimizer_step_seconds(read_metrics(tmp_path)) == pytest.approx(2.0 + 2.0 + 1.0 + 1.0)



def test_the_trainers_running_total_is_read_where_the_records_carry_it(tmp_path: Path) -> None:
    """Records with `step_seconds` give the last train record's total, not the tokens/s estimate (which here
    would be 2 + 2 = 4 s)."""
    records = [{"split": "train", "step": 2, "tokens_seen": 200, "tokens_per_s": 100.0, "step_seconds": 3.25},
               {"split": "train", "step": 4, "tokens_seen": 400, "tokens_per_s": 100.0, "step_seconds": 7.5},
               {"split": "eval", "step": 4, "loss": 1.0}]
    _write(tmp_path / METRICS_FILE, records)
    assert optimizer_step_seconds(read_metrics(tmp_path)) == 7.5
