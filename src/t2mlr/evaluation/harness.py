"""lm-eval's own command line with the "t2mlr" model registered, the shipped tasks on the task path and
a device that exists on this machine.

A saved T²MLR directory needs none of this: stock lm-eval scores it as the transformers causal LM it is,
on the path its config names for evaluation (exact unless changed):

    lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks TASKS --device cpu

The model "t2mlr" (`t2mlr.evaluation.lm_eval_model`, lm-eval's HFLM plus the path arguments) names the
path explicitly, Jacobi included, and records it in the results. lm-eval 0.4.x finds models only in its
in-process registry (it reads no entry points), so a bare `lm_eval --model t2mlr ...` fails with "no
model for this name"; this runs lm-eval's command line after importing the registration:

    python -m t2mlr.evaluation run --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy
    t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=8 --tasks arc_easy

Every lm-eval option works as documented by lm-eval (`run`, `ls`, `validate` subcommands included),
with three differences, all made here:

* the directory of shipped tasks (`t2mlr_toy`, `t2mlr_toy_gen`, tag `t2mlr_toy_all`) is appended to
  --include_path (a YAML --config's include_path is replaced by it; pass --include_path on the
  command line instead);
* lm-eval's default device is "cuda:0" even where torch has no CUDA; without --device (and without a
  device in --model_args or the YAML --config) the device is CUDA when available, else the CPU; a
  device this machine lacks is a one-line error (exit code 2) before anything is loaded;
* `--help` (or no arguments) prints the t2mlr section below, then lm-eval's own help.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from t2mlr.evaluation import TASKS_DIR
from t2mlr.utils import check_model_dir, nearest_name, resolve_device

__all__ = ["HFLM_ARGS", "MODEL_ARGS", "SHIPPED_TASKS", "help_text", "main", "run_harness", "with_device", "with_shipped_tasks"]

HELP_FLAGS = ("-h", "--help")
HELP_WIDTH = 100

# The arguments --model t2mlr adds to lm-eval's HFLM (`T2MLRLM.__init__`).
MODEL_ARGS: dict[str, str] = {
    "recurrence": "exact (default: the definition, middle block token by token) or jacobi (temporal-parallel "
    "approximation); used on every scoring call and every generation, never taken from the saved config",
    "d_forward": "N: Jacobi cache iterations (recurrence=jacobi only; default: the saved config's d_forward); "
    "position t is exact once N >= t, so N >= sequence length + 1 gives the exact scores",
    "exact_solver": "sequential (default: the token loop), fixed_point or auto (recurrence=exact only): how the "
    "exact path is computed (docs/model.md, 'Solving the exact path'; the saved config's fixed_point_* settings); "
    "the passes it took are recorded as t2mlr_exact_solve",
    "device": "as HFLM's (cpu, cuda, cuda:1, ...; the same as --device, give one), but the default is CUDA if "
    "available, else the CPU",
    "exit_layer": "E: early exit, blocks after block E (1-based) skipped and the final norm and head applied to its "
    "output; plain models, and T²MLR with E >= l_end (an exit inside or before the recurrent block is refused)",
}
# The HFLM arguments most runs set (`--model t2mlr` takes every HFLM argument; lm-eval documents them all).
HFLM_ARGS: dict[str, str] = {
    "pretrained": "DIR: a saved model with its tokenizer (save_pretrained of both); required",
    "tokenizer": "tokenizer directory or hub id, when DIR holds none",
    "dtype": "auto (as saved), float32, bfloat16 or float16",
    "batch_size": "requests per forward: an int, or auto / auto:N (the largest that fits); the same as --batch_size",
    "max_length": "context limit in tokens (default: the base model's max_position_embeddings)",
    "add_bos_token": "true/false: add the tokenizer's special tokens when encoding (default: the tokenizer's own)",
    "peft": "a PEFT adapter directory to load over DIR (e.g. a LoRA saved by TRL's SFTTrainer)",
}

SHIPPED_TASKS: dict[str, str] = {
    "t2mlr_toy": "8 three-way multiple-choice questions scored by loglikelihood (accuracy)",
    "t2mlr_toy_gen": "the same questions answered by greedy generation (exact match)",
    "t2mlr_toy_all": "tag: both of the above",
}


def help_text() -> str:
    """The t2mlr section printed before lm-eval's own help."""
    width = max(map(len, [*MODEL_ARGS, *HFLM_ARGS, *SHIPPED_TASKS]))

    def listing(entries: dict[str, str]) -> str:
        return "\n".join(
            textwrap.fill(text, HELP_WIDTH, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4))
            for name, text in entries.items()
        )

    model_args, hflm_args, tasks = listing(MODEL_ARGS), listing(HFLM_ARGS), listing(SHIPPED_TASKS)
    return f"""\
t2mlr eval / python -m t2mlr.evaluation: lm-evaluation-harness for T²MLR models

Everything after `eval` is lm-eval's own command line. Before running it, these wrappers register
the model type "t2mlr" (lm-eval's HFLM whose scores and generations always use the path named in
--model_args), add the shipped offline tasks to --include_path, and pick the device
CUDA-if-available-else-CPU when none is given (lm-eval's own default is cuda:0, which fails on a machine
without CUDA).

Stock lm-eval scores a saved T²MLR directory too, on the path its config names for evaluation
(eval_recurrence, exact unless changed), without recording it:
  lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks TASKS --device cpu
`lm_eval --model t2mlr ...` on its own cannot work: lm-eval 0.4.x looks models up only in its
in-process registry and has no plugin discovery, so "t2mlr" exists only once
t2mlr.evaluation.lm_eval_model has been imported. Use these wrappers, or in Python
`import t2mlr.evaluation.lm_eval_model` before `lm_eval.simple_evaluate(model="t2mlr", ...)`.

--model_args of --model t2mlr (comma-separated key=value), its own:
{model_args}
and every argument of lm-eval's --model hf (HFLM), e.g.:
{hflm_args}

Shipped offline tasks (no download):
{tasks}
Hub tasks (arc_easy, arc_challenge, hellaswag, openbookqa, piqa, sciq, winogrande) need the hub.

Examples:
  t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks t2mlr_toy
  t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=jacobi,d_forward=16 \\
      --tasks arc_easy,hellaswag --batch_size auto

lm-eval's own help follows.
{"-" * HELP_WIDTH}
"""


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


def with_device(args: argparse.Namespace) -> argparse.Namespace:
    """Set --device to one this machine has, checked: the user's (from --device or --model_args), else
    CUDA when available, else the CPU. A device in --model_args moves to --device, because lm-eval
    passes --device to the model as a keyword of its own and two would collide."""
    if not hasattr(args, "device"):  # `ls`, `validate`: nothing runs a model
        return args
    model_args: dict[str, Any] = args.model_args if isinstance(args.model_args, dict) else {}
    in_model_args = model_args.pop("device", None)
    if args.device is not None and in_model_args is not None and str(in_model_args) != str(args.device):
        raise ValueError(
            f"two devices were given: --device {args.device} and device={in_model_args} in --model_args; give one"
        )
    chosen = args.device if args.device is not None else in_model_args
    if chosen is None and _device_in_yaml_config(args) is None:
        chosen = "auto"
    if chosen is not None:
        args.device = str(resolve_device(str(chosen)))
    return args


def looks_local(name: str) -> bool:
    """Whether a `pretrained=` value names a path on this machine rather than a hub repo ("org/name" has one
    slash and no leading '/', '.' or '~')."""
    return Path(name).exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1


def check_local_model(args: argparse.Namespace) -> None:
    """A local `pretrained=` directory must hold a saved model (ModelDirectoryError otherwise)."""
    model_args = getattr(args, "model_args", None)
    pretrained = model_args.get("pretrained") if isinstance(model_args, dict) else None
    if isinstance(pretrained, str) and looks_local(pretrained):
        check_model_dir(Path(pretrained).expanduser())


def check_task_names(args: argparse.Namespace) -> None:
    """Every task name in --tasks is one lm-eval knows (its own index, with the shipped tasks), else a
    ValueError naming the unknown ones with the nearest known spelling. YAML files and directories are
    left to lm-eval."""
    names = [name for name in getattr(args, "tasks", None) or [] if not name.endswith(".yaml") and not Path(name).is_dir()]
    if not names:
        return
    from lm_eval.tasks import TaskManager  # lm-eval's task index: no torch or transformers

    manager = TaskManager(include_path=args.include_path)
    unknown = [name for name in names if not manager.match_tasks([name])]
    if unknown:
        guesses = {name: nearest_name(name, manager.all_tasks) for name in unknown}
        said = "; ".join(f"{name!r}" + (f" (did you mean {guess!r}?)" if guess else "") for name, guess in guesses.items())
        raise ValueError(f"lm-eval knows no task {said}; `t2mlr eval ls tasks` lists the {len(manager.all_tasks)} it knows")


def _device_in_yaml_config(args: argparse.Namespace) -> Any:
    """The device a YAML --config sets (top level or in its model_args), if any; lm-eval lets
    command-line options override the file, so a default set here would hide it."""
    config_path = getattr(args, "config", None)
    if not config_path:
        return None
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.utils import simple_parse_args_string

    config = EvaluatorConfig.load_yaml_config(config_path)
    model_args = config.get("model_args") or {}
    if isinstance(model_args, str):
        model_args = simple_parse_args_string(model_args)
    return config.get("device", model_args.get("device"))


def run_harness(argv: Sequence[str]) -> int:
    """Parse `argv` with lm-eval's CLI and run it; returns the exit code (2 and one line on stderr for
    a device this machine lacks)."""
    argv = list(argv)
    if not argv or any(flag in argv for flag in HELP_FLAGS):
        print(help_text(), flush=True)
        if not argv:
            argv = ["--help"]
    from lm_eval._cli import HarnessCLI  # light: lm-eval's parser, without torch or transformers
    from lm_eval.utils import setup_logging

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # HarnessCLI reads sys.argv (it inserts "run" for the legacy form)
    try:
        setup_logging()
        cli = HarnessCLI()
        try:
            args = cli.parse_args()
        except SystemExit as exit_:  # --help and usage errors: argparse has printed what to say
            return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
        try:
            args = with_shipped_tasks(args)
            check_local_model(args)
            check_task_names(args)
            args = with_device(args)
        except ValueError as err:  # before the model loads: a wrong path, task name or device is answered at once
            print(f"t2mlr eval: error: {err}", file=sys.stderr)
            return 2
        import t2mlr.evaluation.lm_eval_model  # noqa: F401  (registers "t2mlr"; loads torch, so after --help)

        cli.execute(args)
    finally:
        sys.argv = saved
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_harness(sys.argv[1:] if argv is None else argv)
