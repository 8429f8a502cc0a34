"""The `t2mlr` command line: one subcommand per part of the library.

Each part registers its own subcommands (`register(subparsers)` in its `commands` module), so the CLI
stays a thin dispatcher and every command's code lives beside what it drives. Only the module of the
command being run is imported: `t2mlr --help` and the light commands start without loading torch and
transformers (seconds on a small machine).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

# command -> (module whose `register` adds it, one-line help shown by `t2mlr --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("t2mlr.tasks.commands", "generate the synthetic task datasets (S5-Retrieval, variable assignment, ProsQA-Hard); tokenize corpora"),
    "train": ("t2mlr.training.commands", "train a model from a YAML config or preset"),
    "plot": ("t2mlr.training.commands", "plot a run's loss and fusion-gate curves"),
    "corpus": ("t2mlr.corpus.commands", "tokenize corpora (parquet/jsonl/txt) into resumable token shards; offline English corpus"),
    "generate": ("t2mlr.generation.commands", "generate text from a saved model (T²MLR or a baseline), streaming tokens"),
    "eval": ("t2mlr.evaluation.commands", "evaluate with lm-evaluation-harness (the t2mlr model registered)"),
    "params": ("t2mlr.experiments.parameter_counts", "parameter counts of T²MLR and its matched baselines"),
    "retrofit": ("t2mlr.training.retrofit_command", "turn a pretrained decoder (hub id, directory, GGUF) into a T²MLR checkpoint"),
    "experiment": ("t2mlr.experiments.commands", "run a paper experiment end to end"),
    "rl": ("t2mlr.rl.commands", "reinforcement learning (GRPO on TRL) with the policy update replayed from the rollout's recurrent states"),
    "analyze": ("t2mlr.analysis.commands", "the paper's analyses on your checkpoints: gradient fidelity, Jacobi vs exact training, probes, gates, placement"),
    "serve": ("t2mlr.serving.commands", "serve a saved T²MLR model with vLLM (OpenAI-compatible server; needs vLLM installed)"),
}
# Groups that gather subcommands from parts on one layer (neither may import the other): group ->
# (module, function) pairs, each function adding its subcommands to the group's subparsers; the group's
# `register` receives them as `joined`.
JOINED_SUBCOMMANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "data": (("t2mlr.corpus.commands", "add_tokenize_parser"),),
}
# Commands that load saved models also load every model type the library defines (the baselines register
# theirs with the Auto classes when imported), so a saved baseline loads like a T²MLR model: the command calls
# `args.load_model_types()` once it has checked its input, so a bad path is reported before torch loads.
LOADS_SAVED_MODELS = {"generate": ("t2mlr.baselines",)}
DESCRIPTION = "T²MLR: Transformer with Temporal Middle-Layer Recurrence. `t2mlr COMMAND --help` explains a command."


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's full arguments (`command=None`), or with the full arguments of one
    command and a one-line entry for each other."""
    return _parser({module for module, _ in COMMANDS.values()} if command is None else {COMMANDS[command][0]})


def _parser(modules: set[str]) -> argparse.ArgumentParser:
    """The full arguments of the commands that `modules` register, and a one-line entry for every other."""
    parser = argparse.ArgumentParser(prog="t2mlr", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(modules):
        importlib.import_module(module).register(subparsers, **_joined_into(module))
    registered = set(subparsers.choices)
    for name, (_, summary) in COMMANDS.items():
        if name not in registered:
            subparsers.add_parser(name, help=summary)
    return parser


def _joined_into(module: str) -> dict[str, list[Callable[[Any], None]]]:
    """`{"joined": [...]}` for a module whose group gathers other parts' subcommands, else `{}`."""
    joined = [getattr(importlib.import_module(source), function)
              for name, pairs in JOINED_SUBCOMMANDS.items() if COMMANDS[name][0] == module
              for source, function in pairs]
    return {"joined": joined} if joined else {}


def _command_of(argv: Sequence[str]) -> str | None:
    """The command word of argv, if it names one (options before it are the top-level parser's)."""
    word = next((word for word in argv if not word.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    parser = build_parser(command) if command is not None else _parser(set())  # --help, mistyped: nothing imported
    args = parser.parse_args(argv)  # --help and argument errors end here, before anything heavy loads
    if command in LOADS_SAVED_MODELS:
        args.load_model_types = lambda: [importlib.import_module(module) for module in LOADS_SAVED_MODELS[command]]
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
