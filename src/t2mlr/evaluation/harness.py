"""lm-eval's own command line with the "t2mlr" model registered and the shipped tasks on the task path.

lm-eval 0.4.x finds models only in its registry (it does not read the `lm_eval` entry-point group that
pyproject declares), so a bare `lm_eval --model t2mlr ...` fails with "no model for this name". This
runs the same command line after importing the registration:

    python -m t2mlr.evaluation --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy
    t2mlr eval --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=8 --tasks arc_easy

Every lm-eval option works as documented by lm-eval (`run`, `ls`, `validate` subcommands included);
the directory of shipped tasks (`t2mlr_toy`, `t2mlr_toy_gen`, tag `t2mlr_toy_all`) is appended to
--include_path (a YAML --config's include_path is replaced by it; pass --include_path on the command
line instead).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from t2mlr.evaluation import TASKS_DIR


def with_shipped_tasks(args: argparse.Namespace) -> argparse.Namespace:
    """Add the shipped task directory to the parsed --include_path (lm-eval's TaskManager takes a list)."""
    if not hasattr(args, "include_path"):
        return args
    given = args.include_path
    paths = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
    if str(TASKS_DIR) not in map(str, paths):
        paths.append(str(TASKS_DIR))
    args.include_path = paths
    return args


def run_harness(argv: Sequence[str]) -> int:
    """Parse `argv` with lm-eval's CLI and run it; returns the exit code."""
    import t2mlr.evaluation.lm_eval_model  # noqa: F401  (registers "t2mlr")
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # HarnessCLI reads sys.argv (it inserts "run" for the legacy form)
    try:
        setup_logging()
        cli = HarnessCLI()
        args = with_shipped_tasks(cli.parse_args())
        cli.execute(args)
    finally:
        sys.argv = saved
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_harness(sys.argv[1:] if argv is None else argv)
