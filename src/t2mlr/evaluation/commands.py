"""`t2mlr eval [lm-eval arguments]`: lm-evaluation-harness with the "t2mlr" model registered.

Everything after `eval` goes to lm-eval's own command line (see `t2mlr.evaluation.harness`, which also
adds the shipped tasks, picks a device this machine has when none is given, and prints a t2mlr section
before lm-eval's help), e.g.

    t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy
    t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=8 \\
        --tasks arc_easy,arc_challenge,hellaswag --batch_size 16
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "eval",
        help="lm-evaluation-harness with the t2mlr model (`t2mlr eval --help`: its model args, then lm-eval's help)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # `t2mlr eval --help` goes to the harness: the t2mlr section, then lm-eval's help
        prefix_chars="+",  # no options of its own: "--model" etc. are lm-eval's, passed through as they are
    )
    parser.add_argument("lm_eval_args", nargs="*", help="arguments for lm-eval")
    parser.set_defaults(func=run_eval)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    from t2mlr.evaluation.harness import run_harness

    return run_harness(args.lm_eval_args)
