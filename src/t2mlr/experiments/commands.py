"""`t2mlr experiment …`: the paper's experiments end to end.

    t2mlr experiment s5-retrieval --preset cpu --out runs/s5      # ~20 min on 2 CPU cores
    t2mlr experiment s5-retrieval --preset paper --out runs/s5    # GPU, paper settings
    t2mlr experiment s5-retrieval --preset tiny --out /tmp/s5     # seconds: pipeline check only

Writes OUT/results.md, OUT/results.json, OUT/accuracy_vs_length.png, the data under OUT/data and one
training run directory per model (checkpoints, metrics.jsonl, train.log). On a CPU the models train
side by side, one worker process each up to the CPU threads (--workers); on a GPU in turn. Workers end
with the command: killing it (even with SIGKILL) leaves no training behind.

Every model checkpoints as it trains (cpu preset: every 250 steps; --checkpoint-every changes it), and
`--resume` continues each run from its latest checkpoint exactly as if it had never stopped: the same
numbers as an uninterrupted run, given the same --workers and --threads (the thread count sets the
float summation order). Exit codes: 0 done, 1 training stopped (non-finite loss), 2 bad input or an
existing run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "register"]


def run_s5(args: argparse.Namespace) -> int:
    import torch

    from t2mlr.training.exit_codes import run_with_exit_codes

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return run_with_exit_codes("t2mlr experiment s5-retrieval", lambda: _run_s5(args))[0]


def _run_s5(args: argparse.Namespace) -> None:
    from t2mlr.experiments.s5_presets import get_preset
    from t2mlr.experiments.s5_retrieval import run_experiment

    preset = get_preset(args.preset)
    if args.steps is not None:
        preset = preset.with_steps(**{name: args.steps for name in preset.steps})
    if args.seed is not None:
        preset = dataclasses.replace(preset, seed=args.seed)
    if args.checkpoint_every is not None:
        if args.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got {args.checkpoint_every}")
        preset = dataclasses.replace(preset, checkpoint_every=args.checkpoint_every)
    run_experiment(preset, args.out, device=args.device, models=tuple(args.models),
                   resume=args.resume, overwrite=args.overwrite, workers=args.workers)


def _add_s5(sub: Any) -> None:
    p = sub.add_parser("s5-retrieval", help="S5-Retrieval: T²MLR vs matched Transformer and LSTM",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("cpu", "paper", "tiny"), default="cpu", help="settings (default: cpu)")
    p.add_argument("--out", type=Path, default=Path("runs/s5"), help="output directory (default: runs/s5)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="training device (default: auto)")
    p.add_argument("--models", nargs="+", default=["t2mlr", "transformer", "lstm"], metavar="MODEL",
                   help="models to train (default: t2mlr transformer lstm, the preset's three); any arm of "
                        "`t2mlr params` joins them at T²MLR's parameter count: t2mlr:S-E (another placement), "
                        "looped:full:K, looped:S-E:K, pause:P (the baselines train the Transformer's steps)")
    p.add_argument("--steps", type=int, default=None, help="override every model's training steps")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads in all, split between the workers (default: torch's choice)")
    p.add_argument("--workers", type=int, default=None,
                   help="models trained at a time, each in its own process (default: one per model up to the "
                        "CPU threads on CPU, 1 on a GPU)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the data (and the cpu preset's generating set) and of training (default: the preset's, 0)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint every model every STEPS steps, 0 only at the end (default: the preset's; "
                        "cpu: 250); changes no result")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="continue existing runs in --out from their latest checkpoints (finished ones are only "
                            "re-evaluated)")
    group.add_argument("--overwrite", action="store_true", help="delete existing runs in --out first")
    p.set_defaults(func=run_s5)


# Modules of the other experiments: each defines `add_experiment(sub)`, which adds its subcommand and keeps
# its heavy imports inside the command's function (so `t2mlr experiment --help` stays light).
EXPERIMENT_MODULES: tuple[str, ...] = (
    "t2mlr.experiments.pretrain",
    "t2mlr.experiments.finetune_command",
    "t2mlr.experiments.retrofit",
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `experiment` group to a main CLI's subparsers; every leaf sets `func`."""
    parser = subparsers.add_parser("experiment", help="run a paper experiment end to end")
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    _add_s5(sub)
    for module in EXPERIMENT_MODULES:
        importlib.import_module(module).add_experiment(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone: `python -m t2mlr.experiments.commands experiment s5-retrieval --preset tiny`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
