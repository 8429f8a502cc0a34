"""`t2mlr eval [lm-eval arguments]`: lm-evaluation-harness with the "t2mlr" model registered.

Everything after `eval` goes to lm-eval's own command line unchanged (see `t2mlr.evaluation.harness`),
e.g.

    t2mlr eval --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy --device cpu
    t2mlr eval --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=8 \\
        --tasks arc_easy,arc_challenge,hellaswag --batch_size 16
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "eval",
        help="lm-evaluation-harness with the t2mlr model (all further arguments go to lm-eval)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # `t2mlr eval --help` shows lm-eval's help
        prefix_chars="+",  # no options of its own: "--model" etc. are lm-eval's, passed through as they are
    )
    parser.add_argument("lm_eval_args", nargs="*", help="arguments for lm-eval")
    parser.set_defaults(func=run_eval)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    from t2mlr.evaluation.harness import run_harness

    return run_harness(args.lm_eval_args)
