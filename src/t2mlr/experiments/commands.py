"""`t2mlr experiment …`: the paper's experiments end to end.

    t2mlr experiment s5-retrieval --preset cpu --out runs/s5      # ~20 min on 2 CPU cores
    t2mlr experiment s5-retrieval --preset paper --out runs/s5    # GPU, paper settings
    t2mlr experiment s5-retrieval --preset tiny --out /tmp/s5     # seconds: pipeline check only
    t2mlr experiment s5-retrieval --preset cpu --train-recurrence jacobi --d-forward 16 --d-backward 4 --out runs/s5_jacobi
    t2mlr experiment s5-retrieval --preset cpu --models t2mlr transformer looped:full:2 pause:2 \
        transformer:compute-matched --out runs/s5_arms

Writes OUT/results.md, OUT/results.json, OUT/accuracy_vs_length.png, the data under OUT/data and one
training run directory per model (checkpoints, metrics.jsonl, train.log). On a CPU the models train
side by side, one worker process each up to the CPU threads (--workers); on a GPU in turn. Workers end
with the command: killing it (even with SIGKILL) leaves no training behind.

Every model checkpoints as it trains (cpu preset: every 250 steps; --checkpoint-every changes it), and
`--resume` continues each run from its latest checkpoint exactly as if it had never stopped. Every run
and the evaluation compute on the preset's fixed number of torch threads (1; --threads changes it, and
with it the float summation order), so a seed's numbers are the same whatever --workers, the machine's
load, or an interruption; only the times change. Exit codes: 0 done, 1 training stopped (non-finite
loss), 2 bad input or an existing run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "register"]

S5_PRESET_NAMES = ("cpu", "cpu-deep", "paper", "tiny", "tiny-deep")  # s5_presets.PRESETS, kept light for --help
S5_EVIDENCE_DESIGNS = ("cpu", "tiny")  # t2mlr.experiments.s5_evidence.DESIGNS


def run_s5(args: argparse.Namespace) -> int:
    from t2mlr.training.exit_codes import run_with_exit_codes

    return run_with_exit_codes("t2mlr experiment s5-retrieval", lambda: _run_s5(args))[0]


def s5_preset_from_args(args: argparse.Namespace) -> Any:
    """The named preset with the command line's changes (each checked; a bad one is a ValueError: exit 2)."""
    from t2mlr.experiments.s5_presets import get_preset

    preset = get_preset(args.preset)
    if getattr(args, "steps", None) is not None:
        preset = preset.with_steps(**{name: args.steps for name in preset.steps})
    if getattr(args, "seed", None) is not None:
        preset = dataclasses.replace(preset, seed=args.seed)
    if args.checkpoint_every is not None:
        if args.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got {args.checkpoint_every}")
        preset = dataclasses.replace(preset, checkpoint_every=args.checkpoint_every)
    if args.threads is not None:
        preset = dataclasses.replace(preset, torch_threads=args.threads)  # S5Preset checks it
    return with_training_path(preset, getattr(args, "train_recurrence", None), getattr(args, "d_forward", None),
                              getattr(args, "d_backward", None))


def with_training_path(preset: Any, recurrence: str | None, d_forward: int | None, d_backward: int | None) -> Any:
    """The preset with T²MLR's training path changed (None: the preset's value). Depths only mean something on
    the Jacobi path, so giving them for exact training is refused rather than ignored."""
    recurrence = recurrence or preset.train_recurrence
    forward = preset.d_forward if d_forward is None else d_forward
    backward = preset.d_backward if d_backward is None else d_backward
    if recurrence == "exact" and (d_forward is not None or d_backward is not None):
        raise ValueError("--d-forward / --d-backward set the Jacobi training depths; T²MLR trains on the exact path "
                         "here (pass --train-recurrence jacobi)")
    if not 1 <= backward <= forward:
        raise ValueError(f"need 1 <= --d-backward <= --d-forward, got d_forward={forward}, d_backward={backward}")
    return dataclasses.replace(preset, train_recurrence=recurrence, d_forward=forward, d_backward=backward)


def _run_s5(args: argparse.Namespace) -> None:
    from t2mlr.experiments.s5_retrieval import run_experiment

    run_experiment(s5_preset_from_args(args), args.out, device=args.device, models=tuple(args.models),
                   resume=args.resume, overwrite=args.overwrite, workers=args.workers)


def _add_s5(sub: Any) -> None:
    p = sub.add_parser("s5-retrieval", help="S5-Retrieval: T²MLR vs matched Transformer and LSTM",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=S5_PRESET_NAMES, default="cpu", help="settings (default: cpu)")
    p.add_argument("--out", type=Path, default=Path("runs/s5"), help="output directory (default: runs/s5)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="training device (default: auto)")
    p.add_argument("--models", nargs="+", default=["t2mlr", "transformer", "lstm"], metavar="MODEL",
                   help="models to train (default: t2mlr transformer lstm, the preset's three); any arm of "
                        "`t2mlr params` joins them at T²MLR's parameter count: t2mlr:S-E (another placement), "
                        "t2mlr:S-E:exact or t2mlr:S-E:jacobi:F:B (T²MLR on its own training path), "
                        "looped:full:K, looped:S-E:K, pause:P (the baselines train the Transformer's steps), "
                        "transformer:compute-matched (the matched Transformer for T²MLR's measured training "
                        "compute: T²MLR's steps × the preset's measured compute_matched_ratio)")
    p.add_argument("--train-recurrence", choices=("exact", "jacobi"), default=None,
                   help="T²MLR's training path (the t2mlr arm and t2mlr:S-E arms without a path of their own; "
                        "default: the preset's, cpu: exact); evaluation is always exact")
    p.add_argument("--d-forward", type=int, default=None, help="Jacobi training d_forward (default: the preset's, 16)")
    p.add_argument("--d-backward", type=int, default=None, help="Jacobi training d_backward (default: the preset's, 4)")
    p.add_argument("--steps", type=int, default=None, help="override every model's training steps")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of every training run and of the evaluation (default: the preset's, 1); "
                        "part of the arithmetic, recorded in results.json")
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


def run_s5_evidence(args: argparse.Namespace) -> int:
    from t2mlr.training.exit_codes import run_with_exit_codes

    return run_with_exit_codes("t2mlr experiment s5-evidence", lambda: _run_s5_evidence(args))[0]


def _run_s5_evidence(args: argparse.Namespace) -> None:
    from t2mlr.experiments.s5_evidence import run_study

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if args.checkpoint_every is not None and args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got {args.checkpoint_every}")
    run_study(args.preset, args.seeds, args.out, report=args.report, device=args.device, workers=args.workers,
              analyses=not args.skip_analyses, steps=args.steps, checkpoint_every=args.checkpoint_every,
              cost_rounds=args.cost_rounds, decode_rounds=args.decode_rounds)


S5_EVIDENCE_HELP = """The S5-Retrieval evidence study (docs/s5_evidence.md), resumable:

    t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence --report results/s5_evidence

Measures every arm's training-step and decoding cost side by side (once, OUT/costs/), trains every arm for
every seed (cpu: T²MLR exact, Jacobi (16,4) and (4,2); the matched Transformer at the preset's steps and
compute-matched; looped full ×2 and ×3; pause ×2; and on the 4-block cpu-deep variant T²MLR(2,3), looped
2-3 ×3 and the matched Transformer), evaluates each seed (OUT/seed_S/PRESET/results.md), runs the gate,
gradient-fidelity and Jacobi-depth analyses on the trained T²MLR models, and writes one report with every
seed's numbers, the mean and spread per arm, and the figures. The same command continues an interrupted
study; finished runs are not retrained. Exit codes: 0 done (failed runs are recorded in the report),
2 bad input.
"""


def _add_s5_evidence(sub: Any) -> None:
    p = sub.add_parser("s5-evidence", help="S5-Retrieval evidence study: Jacobi vs exact training, looped and pause "
                       "baselines, the paper's analyses, over seeds; one report",
                       description=S5_EVIDENCE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=S5_EVIDENCE_DESIGNS, default="cpu",
                   help="the study's design: cpu (with its 4-block cpu-deep variant) or tiny (pipeline check)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="SEED", help="seeds (default: 0 1 2)")
    p.add_argument("--out", type=Path, default=Path("runs/s5_evidence"),
                   help="run directories, checkpoints and per-seed results (default: runs/s5_evidence)")
    p.add_argument("--report", type=Path, default=None,
                   help="where the one report goes (default: OUT/report; the repository's is results/s5_evidence)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu", help="training device (default: cpu)")
    p.add_argument("--workers", type=int, default=None,
                   help="runs trained at a time, each in its own single-thread process (default: one per CPU thread)")
    p.add_argument("--skip-analyses", action="store_true",
                   help="train and evaluate only (the analyses and the report run on the next call)")
    p.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)  # tests: every arm's steps
    p.add_argument("--checkpoint-every", type=int, default=None, help=argparse.SUPPRESS)  # tests
    p.add_argument("--cost-rounds", type=int, default=21, help="paired rounds of the training-cost measurement")
    p.add_argument("--decode-rounds", type=int, default=11, help="paired rounds of the decoding-cost measurement")
    p.set_defaults(func=run_s5_evidence)


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
    _add_s5_evidence(sub)
    for module in EXPERIMENT_MODULES:
        importlib.import_module(module).add_experiment(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone: `python -m t2mlr.experiments.commands experiment s5-retrieval --preset tiny`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
