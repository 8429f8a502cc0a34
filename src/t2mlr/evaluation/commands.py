"""`t2mlr eval [lm-eval arguments]`: lm-evaluation-harness with the "t2mlr" model registered.

Everything after `eval` goes to lm-eval's own command line (see `t2mlr.evaluation.harness`, which also
adds the shipped tasks, picks a device this machine has when none is given, and prints a t2mlr section
before lm-eval's help), e.g.

    t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy
    t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=8 \\
        --tasks arc_easy,arc_challenge,hellaswag --batch_size 16

except `t2mlr eval zero-shot CHECKPOINT [CHECKPOINT ...] --out DIR [--data-dir LOCAL]`, the paper's
zero-shot table (seven tasks, one row per checkpoint; `t2mlr eval zero-shot --help`, and
`t2mlr.evaluation.zero_shot`).
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


ZERO_SHOT = "zero-shot"


def run_eval(args: argparse.Namespace) -> int:
    if args.lm_eval_args[:1] == [ZERO_SHOT]:
        return run_zero_shot_command(args.lm_eval_args[1:])
    from t2mlr.evaluation.harness import run_harness

    return run_harness(args.lm_eval_args)


def zero_shot_parser() -> argparse.ArgumentParser:
    from t2mlr.evaluation import zero_shot

    parser = argparse.ArgumentParser(prog=f"t2mlr eval {ZERO_SHOT}", description=zero_shot.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="saved model directories (T²MLR or baseline)")
    parser.add_argument("--out", required=True, help="output directory: zero_shot.md, zero_shot.json, lm_eval/*.json")
    parser.add_argument("--data-dir", default=None, help="local copies of the task data (layout above); default: the hub")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N documents of each task")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per forward (default 8)")
    parser.add_argument("--recurrence", choices=("exact", "jacobi"), default="exact",
                        help="the path T²MLR checkpoints are scored on (default: exact)")
    parser.add_argument("--d-forward", type=int, default=None, help="Jacobi iterations (--recurrence jacobi)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1, ...")
    parser.add_argument("--exit-layer", type=int, default=None, metavar="E",
                        help="early exit: skip the blocks after block E (1-based); T²MLR needs E >= l_end")
    return parser


def run_zero_shot_command(argv: list[str]) -> int:
    """Exit 0 with the table written (its path printed); 2 on bad input (missing local data, a bad checkpoint)."""
    import sys

    args = zero_shot_parser().parse_args(argv)
    from t2mlr.evaluation.zero_shot import run_zero_shot

    try:
        rows = run_zero_shot(args.checkpoints, args.out, data_dir=args.data_dir, limit=args.limit,
                             batch_size=args.batch_size, recurrence=args.recurrence, d_forward=args.d_forward,
                             device=args.device, exit_layer=args.exit_layer)
    except (ValueError, OSError) as err:  # ModelDirectoryError, MissingTaskDataError are ValueErrors
        print(f"t2mlr eval {ZERO_SHOT}: {err}", file=sys.stderr)
        return 2
    for row in rows:
        print(f"{row['checkpoint']} ({row['path']}): average {row['Average']:.2f}")
    print(f"wrote {args.out}/zero_shot.md and {args.out}/zero_shot.json")
    return 0
