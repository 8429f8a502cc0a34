"""Evaluation of T²MLR models with lm-evaluation-harness.

A saved T²MLR directory is a transformers causal LM: stock lm-eval scores it as it is (`--model hf`,
`trust_remote_code=True`). `lm_eval_model` registers the lm-eval model "t2mlr", lm-eval's HFLM with the
recurrence path named and recorded (imported on demand: lm_eval is an optional dependency); `harness`
runs lm-eval's own command line with that registration and the shipped tasks (`tasks/`, e.g. the
offline toy task `t2mlr_toy`) in place.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"

__all__ = ["TASKS_DIR"]
