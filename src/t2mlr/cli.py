"""The `t2mlr` command line: one subcommand per part of the library.

Each part registers its own subcommands (`register(subparsers)` in its `commands` module), so the CLI
stays a thin dispatcher and every command's code lives beside what it drives.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "t2mlr.tasks.commands",  # data
    "t2mlr.training.commands",  # train, plot
    "t2mlr.generation.commands",  # generate
    "t2mlr.evaluation.commands",  # eval
    "t2mlr.experiments.parameter_counts",  # params
    "t2mlr.experiments.commands",  # experiment
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t2mlr", description="T²MLR: Transformer with Temporal Middle-Layer Recurrence"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
