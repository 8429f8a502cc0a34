"""The `train` and `plot` commands (each part of the library registers its own commands
into the `t2mlr` parser with `register`). Handlers return the exit code their help documents."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import sys
import types
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("t2mlr.training")


TRAIN_DESCRIPTION = """\
Train a model from a YAML config or a preset (`debug`, `smollm2_135m_13_18`, ...: see configs/).

examples:
  t2mlr train debug --out runs/debug                       # a tiny model on synthetic data, seconds on a CPU
  t2mlr train debug --out runs/debug optim.lr=1e-3 model.l_start=3
  t2mlr train debug --out runs/debug --stop-after 20       # stop early; the schedule is unchanged
  t2mlr train debug --out runs/debug --resume              # ... and continue exactly where it stopped
  torchrun --nproc_per_node 8 -m t2mlr train smollm2_135m_13_18 --out runs/x --parallel fsdp
  t2mlr train smollm2_1b_9_24 --dry-run --devices 4 --gpu h100   # size it first: memory, time, launch line

Overrides are dotted `key=value` pairs, before or after the options; every key is checked and a
misspelt one fails before anything is built. The run directory gets config.yaml, train.log,
metrics.jsonl, checkpoints/step_N (each loads with from_pretrained, `t2mlr generate`, `t2mlr eval`)
and, when training finishes, final/ (weights, config and tokenizer only).

CPU threads: by default the cores that are not busy when the run starts (available cores minus the
1-minute load average, at least 1): on a shared machine more threads than free cores make every
step wait. A resumed run reuses the count it ran with; --threads sets it.

exit codes: 0 done or stopped as asked, 1 training stopped on a non-finite loss (the last good
checkpoint is kept), 2 bad input (config, data, checkpoint, or a resume that would change the run).

--dry-run builds the model on the meta device (no weights) and prints its parameters, memory per device
(weights, gradients, AdamW state, activations), tokens and FLOPs per step, step time and GPU-hours at an
assumed model-FLOP utilisation on --devices GPUs of kind --gpu, and the command that launches the run
(docs/scale.md). It exits 2 when the devices do not divide the batch, the GPU kind is unknown, or the run
cannot fit even sharded over as many devices as the batch allows."""


def register(subparsers: Any) -> None:
    """Add `train` and `plot` to an `argparse` subparsers object; each sets `func` to its handler."""
    train = subparsers.add_parser("train", help="train a model from a YAML config or preset",
                                  description=TRAIN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("config", help="YAML config path or preset name (configs/<name>.yaml)")
    train.add_argument("overrides", nargs="*", default=[], help="dotted key=value overrides, e.g. optim.lr=1e-3")
    train.add_argument("--out", default=None,
                       help="run directory (checkpoints, metrics.jsonl, train.log); required unless --dry-run")
    train.add_argument("--max-steps", type=int, default=None,
                       help="set train.max_steps (the run's length and its schedule's; to stop early use --stop-after)")
    train.add_argument("--stop-after", type=int, default=None, metavar="N",
                       help="stop after step N with a checkpoint, leaving the schedule as configured")
    train.add_argument("--resume", action="store_true",
                       help="continue from the run directory's newest checkpoint that verifies")
    train.add_argument("--allow-config-change", action="store_true",
                       help="resume even though the configuration differs from the recorded one")
    train.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default=None,
                       help="data parallelism under torchrun (sets train.parallel); ddp and fsdp need torchrun")
    train.add_argument("--threads", type=int, default=None, metavar="N",
                       help="torch CPU threads (default: the free cores, or the resumed run's count)")
    add_dry_run_options(train, "print parameters, memory per device, FLOPs, step time, GPU-hours and the launch line; "
                               "allocates no weights and trains nothing")
    train.set_defaults(func=run_train)
    accept_trailing_overrides(train)

    plot = subparsers.add_parser("plot", help="plot loss and fusion-gate curves of a run to PNG")
    plot.add_argument("run_dir", help="run directory holding metrics.jsonl")
    plot.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    plot.set_defaults(func=run_plot)


GPU_KIND_NAMES = "h100, h200, a100-80gb, a100-40gb, l40s, a10, a10g, rtx4090"  # training.sizing.GPU_KINDS


def add_dry_run_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--dry-run and its sizing options (--devices, --gpu, --mfu, --json): `t2mlr train`'s and every experiment's."""
    dry = parser.add_argument_group("sizing a run before it is bought (docs/scale.md)")
    dry.add_argument("--dry-run", action="store_true", help=what)
    dry.add_argument("--devices", type=int, default=None, metavar="N", help="GPUs the run would use (default 1)")
    dry.add_argument("--gpu", default=None, metavar="KIND", help=f"GPU kind: {GPU_KIND_NAMES}")
    dry.add_argument("--mfu", type=float, default=None, metavar="U",
                     help="assumed model-FLOP utilisation for the step time (default 0.30)")
    dry.add_argument("--json", action="store_true", help="print the dry run as JSON instead of a table")


def sizing_refusal(args: argparse.Namespace) -> str | None:
    """Why the sizing options cannot be used as given (before any config is loaded); None when they can."""
    sizing_only = [flag for flag, given in (("--devices", args.devices is not None), ("--gpu", args.gpu is not None),
                                            ("--mfu", args.mfu is not None), ("--json", args.json)) if given]
    if args.dry_run:
        if args.gpu is None:
            return f"--dry-run needs --gpu KIND ({GPU_KIND_NAMES})"
        if getattr(args, "resume", False):
            return "--dry-run sizes a new run; --resume does not apply"
        return None
    if sizing_only:
        verb = "applies" if len(sizing_only) == 1 else "apply"
        return f"{', '.join(sizing_only)} {verb} to --dry-run only (a real run's devices are torchrun's processes)"
    return None


def accept_trailing_overrides(parser: argparse.ArgumentParser) -> None:
    """Let `key=value` overrides follow options (`train cfg.yaml --out x a=1`).

    argparse fills a `nargs="*"` positional as soon as it meets the first positional, so later
    `key=value` words would be rejected as unrecognized. This parser (and only this one) moves such
    leftover words into `overrides`; anything else stays unrecognized and errors as usual.
    """

    def parse_known_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = argparse.ArgumentParser.parse_known_args(self, args, namespace)
        trailing = [word for word in extras if "=" in word and not word.startswith("-")]
        given = list(getattr(namespace, "overrides", None) or []) + _taken_from_lists(namespace) + trailing
        words = list(sys.argv[1:] if args is None else args)
        namespace.overrides = sorted(given, key=lambda word: words.index(word) if word in words else len(words))
        return namespace, [word for word in extras if word not in trailing]  # in command-line order: the last wins

    parser.parse_known_args = types.MethodType(parse_known_args, parser)  # type: ignore[method-assign]


DOTTED_OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")  # section.key=value


def _taken_from_lists(namespace: argparse.Namespace) -> list[str]:
    """The `section.key=value` words that a many-valued option swallowed (`--models t2mlr optim.lr=1e-3`),
    taken out of it: they are overrides (no option value is spelt so; `--from ARM=DIR` has no dotted key)."""
    taken = []
    for name, value in vars(namespace).items():
        if name == "overrides" or not isinstance(value, list):
            continue
        words = [word for word in value if isinstance(word, str) and DOTTED_OVERRIDE.match(word)]
        if words:
            setattr(namespace, name, [word for word in value if word not in words])
            taken += words
    return taken


def train_overrides(args: argparse.Namespace) -> list[str]:
    """CLI flags as config overrides (flags win over positional overrides)."""
    flags = (("train.max_steps", args.max_steps), ("train.parallel", args.parallel))
    return list(args.overrides or []) + [f"{key}={value}" for key, value in flags if value is not None]


def run_train(args: argparse.Namespace) -> int:
    from t2mlr.training.config import ConfigError, check_before_loading, load_config
    from t2mlr.training.data_files import DataError

    refusal = launch_refusal(args)
    if refusal is not None:
        print(f"t2mlr train: {refusal}", file=sys.stderr)
        return 2
    try:
        # before torch loads: a typo or a bad data file is reported at once
        check_before_loading(args.config, train_overrides(args), data_files=not args.dry_run)
        cfg = load_config(args.config, train_overrides(args))
    except ConfigError as err:
        print(f"t2mlr train: config error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"t2mlr train: {err}", file=sys.stderr)
        return 2
    import torch

    from t2mlr.training.checkpoint import CheckpointError
    from t2mlr.training.trainer import NonFiniteLossError, train

    if args.dry_run:
        return run_dry_run(args, cfg)
    for flag, value in (("--stop-after", args.stop_after), ("--threads", args.threads)):
        if value is not None and value < 1:
            print(f"t2mlr train: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    threads, why = choose_threads(args.threads, args.out if args.resume else None)
    torch.set_num_threads(threads)
    print(f"t2mlr train: {threads} torch CPU thread(s) ({why})", file=sys.stderr)
    try:
        result = train(cfg, args.out, resume=args.resume, stop_after=args.stop_after,
                       allow_config_change=args.allow_config_change)
    except NonFiniteLossError as err:
        print(f"t2mlr train: stopped: {err}", file=sys.stderr)
        return 1
    except (CheckpointError, FileExistsError, ConfigError, DataError) as err:
        print(f"t2mlr train: {err}", file=sys.stderr)
        return 2
    log.info("done at step %d; last checkpoint: %s", result.step, result.last_checkpoint)
    return 0


def launch_refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot start (or size) a run, before any config is loaded; None when they can.

    `--parallel ddp|fsdp` outside torchrun is refused: the run would train in one process, not the data
    parallelism asked for (a config that sets train.parallel still runs single-process, so a run directory's
    recorded config resumes either way)."""
    refusal = sizing_refusal(args)
    if refusal is not None or args.dry_run:
        return refusal
    if args.out is None:
        return "--out is required (the run directory), unless --dry-run"
    return parallel_refusal(args.parallel, ["train", args.config, "--out", args.out])


def parallel_refusal(parallel: str | None, words: Sequence[str]) -> str | None:
    """Why `--parallel` cannot run as given (None when it can): ddp and fsdp need torchrun, one process per
    device; in a single process they would not parallelise anything. `words`: the command after `t2mlr`, for
    the example torchrun line. Reads the environment only (no torch), so the refusal comes at once."""
    from t2mlr.utils import launched_by_torchrun

    if parallel not in ("ddp", "fsdp") or launched_by_torchrun():
        return None
    example = " ".join(shlex.quote(str(word)) for word in ["-m", "t2mlr", *words, "--parallel", parallel])
    return (f"--parallel {parallel} needs torchrun (one process per device), e.g. `torchrun --nproc_per_node 4 "
            f"{example}`; this is a single process (drop --parallel to run in one)")


def run_dry_run(args: argparse.Namespace, cfg: Any) -> int:
    """Size the run (no weights allocated) and print it; exit 2 when it cannot be sized or cannot fit."""
    import json

    from t2mlr.training.sizing import DEFAULT_MFU, size_run

    extra = list(args.overrides or [])
    if args.max_steps is not None:
        extra += ["--max-steps", str(args.max_steps)]
    try:
        run = size_run(cfg, args.devices or 1, args.gpu, DEFAULT_MFU if args.mfu is None else args.mfu,
                       config_name=args.config, out=args.out, extra_args=extra)
    except ValueError as err:  # a ConfigError (SizingError) included
        print(f"t2mlr train --dry-run: {err}", file=sys.stderr)
        return 2
    print(json.dumps(run.to_dict(), indent=2, default=str) if args.json else run.table())
    return 0


def choose_threads(requested: int | None, resumed_run: str | None) -> tuple[int, str]:
    """The CPU thread count and why: --threads, else the resumed run's recorded count, else the free cores
    (shared among the processes torchrun starts on this machine)."""
    from t2mlr.training.checkpoint import recorded_state
    from t2mlr.utils import free_cores

    if requested is not None:
        return requested, "--threads"
    recorded = recorded_state(resumed_run).get("torch_threads") if resumed_run is not None else None
    if recorded is not None:
        return recorded, "the count the resumed run used"
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, free_cores() // local_processes), "the cores not busy at start-up"


def run_plot(args: argparse.Namespace) -> int:
    from t2mlr.training.plot import plot_run

    try:
        path = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"t2mlr plot: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: `python -m t2mlr.training train ...` (same as `t2mlr train ...`)."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv, prog="python -m t2mlr.training")
