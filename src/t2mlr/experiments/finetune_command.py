"""`t2mlr experiment finetune TASK`: the paper's reasoning finetunes, every arm on one task, pass@1.

    t2mlr experiment finetune variable-assignment --preset cpu --out runs/ft_va
    t2mlr experiment finetune prosqa-hard --preset cpu --out runs/ft_prosqa
    t2mlr experiment finetune gsm-aug --preset paper --variant symbolic --data whynlp/gsm8k-aug --from CKPTS --out runs/ft_gsm
    t2mlr experiment finetune hotpotqa --preset paper --data hotpotqa_cot/ --retrofit MODEL --out runs/ft_hotpot
    t2mlr experiment finetune TASK --arms t2mlr:13-18,t2mlr:1-30,transformer,looped:9-22:3,pause:2 ...

Writes OUT/results.md, OUT/results.json, OUT/pass_at_1.png, OUT/predictions.jsonl, the data under OUT/data
and one training run directory per arm. `t2mlr experiment finetune-summary RUN... --out DIR` gathers several
runs (tasks, seeds) into one table and one figure (one bar group per task, one bar per arm).

--from takes either one directory holding a subdirectory per arm (named like the arm with ':' replaced by
'_', e.g. t2mlr_13-18/, transformer/; a trainer run directory's `final/` is used when present), or
ARM=DIR pairs, one per arm. Exit codes: 0 done, 1 training stopped (non-finite loss), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_experiment"]

TASK_CHOICES = ("variable-assignment", "prosqa-hard", "gsm-aug", "hotpotqa")


def _checkpoint_dirs(values: list[str], arms: list[Any]) -> dict[str, str]:
    """Arm name -> checkpoint directory from --from values (see the module docstring)."""

    names = {a.name for a in arms}
    if len(values) == 1 and "=" not in values[0]:
        root, found = Path(values[0]), {}
        for arm in arms:
            candidate = root / arm.dir_name
            if (candidate / "final" / "config.json").is_file():
                candidate = candidate / "final"
            if not candidate.is_dir():
                raise ValueError(f"--from {root}: no directory {arm.dir_name}/ for arm {arm.name}")
            found[arm.name] = str(candidate)
        return found
    pairs = {}
    for value in values:
        arm, sep, directory = value.partition("=")
        if not sep or not directory:
            raise ValueError(f"--from takes one directory or ARM=DIR pairs, got {value!r}")
        if arm not in names:
            raise ValueError(f"--from {value!r}: {arm!r} is not one of the arms {sorted(names)}")
        pairs[arm] = directory
    missing = sorted(names - set(pairs))
    if missing:
        raise ValueError(f"--from gives no checkpoint for arm(s) {missing}")
    return pairs


def build_plan(args: argparse.Namespace) -> Any:
    """The experiment's plan from the command line; every check that needs no training happens here."""
    from t2mlr.experiments.finetune import (
        FinetunePlan,
        StartingPoint,
        parse_arms,
        with_overrides,
    )
    from t2mlr.experiments.finetune_presets import get_preset

    preset = get_preset(args.preset, args.task)
    preset = with_overrides(preset, steps=args.steps, seed=args.seed, train_size=args.train_size,
                            eval_size=args.eval_size, prefill=args.prefill, eval_batch_size=args.eval_batch_size,
                            prompt_recurrence_mask=args.prompt_recurrence_mask)
    specs = parse_arms(args.arms) if args.arms else parse_arms(",".join(preset.arms))
    if args.from_ and args.retrofit:
        raise ValueError("give either --from (each arm's own checkpoint) or --retrofit (one pretrained model)")
    if args.from_:
        start = StartingPoint("from", checkpoints=_checkpoint_dirs(args.from_, list(specs)))
    elif args.retrofit:
        start = StartingPoint("retrofit", model=args.retrofit)
    elif preset.start != "scratch":
        raise ValueError(f"the {preset.name} preset finetunes pretrained models: pass --from (each arm's own "
                         "checkpoint) or --retrofit MODEL")
    else:
        start = StartingPoint()
    if args.task != "gsm-aug" and args.variant is not None:
        raise ValueError("--variant applies to gsm-aug only")
    variant = (args.variant or "symbolic") if args.task == "gsm-aug" else None
    if args.prefill_depth is not None and preset.prefill != "jacobi":
        raise ValueError("--prefill-depth applies to --prefill jacobi only")
    return FinetunePlan(preset, specs, start, args.data, variant, args.prefill_depth)


def run_finetune_command(args: argparse.Namespace) -> int:
    import torch

    from t2mlr.experiments.finetune import run_finetune
    from t2mlr.training.exit_codes import run_with_exit_codes

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return run_with_exit_codes("t2mlr experiment finetune", lambda: run_finetune(
        build_plan(args), args.out, device=args.device, resume=args.resume, overwrite=args.overwrite,
        workers=args.workers))[0]


def run_summary_command(args: argparse.Namespace) -> int:
    from t2mlr.experiments.finetune_summary import write_summary

    try:
        write_summary([Path(p) for p in args.runs], args.out)
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as err:
        print(f"t2mlr experiment finetune-summary: {err}", file=sys.stderr)
        return 2
    return 0


def _add_finetune(sub: Any) -> None:
    p = sub.add_parser("finetune", help="reasoning finetunes: every arm on one task, pass@1",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=TASK_CHOICES, help="the task")
    p.add_argument("--preset", choices=("cpu", "paper", "tiny"), default="cpu", help="settings (default: cpu)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--arms", default=None,
                   help="comma-separated arms, e.g. t2mlr:13-18,t2mlr:1-30,transformer,looped:9-22:3,pause:2 "
                        "(default: the preset's)")
    p.add_argument("--data", default=None,
                   help="gsm-aug: a .jsonl/.parquet file, a directory with train and test splits (.jsonl, "
                        ".parquet, or a hub snapshot's data/*.parquet), or the hub set (whynlp/gsm8k-aug, "
                        "whynlp/gsm8k-aug-nl); hotpotqa: such a file or directory (`t2mlr data hotpotqa-cot` builds "
                        "one from HotpotQA and chain-of-thought traces)")
    p.add_argument("--variant", choices=("symbolic", "nl"), default=None, help="gsm-aug variant (default: symbolic)")
    p.add_argument("--from", dest="from_", nargs="+", default=None, metavar="DIR_OR_ARM=DIR",
                   help="start each arm from its own checkpoint (see above)")
    p.add_argument("--retrofit", default=None, metavar="MODEL",
                   help="start every arm from this pretrained model (hub id or local directory)")
    p.add_argument("--prompt-recurrence-mask", action=argparse.BooleanOptionalAction, default=None,
                   help="T²MLR fuses its state into target tokens only (the prompt still writes it); default: the preset's (off)")
    p.add_argument("--prefill", choices=("exact", "jacobi"), default=None, help="T²MLR prompt prefill in evaluation (default: exact)")
    p.add_argument("--prefill-depth", type=int, default=None, help="Jacobi prefill iterations (default: d_forward)")
    p.add_argument("--steps", type=int, default=None, help="override the training steps of every arm")
    p.add_argument("--seed", type=int, default=None, help="seed of the data and of training (default: 0)")
    p.add_argument("--train-size", type=int, default=None, help="override the number of training records")
    p.add_argument("--eval-size", type=int, default=None, help="override the number of evaluation problems")
    p.add_argument("--eval-batch-size", type=int, default=None, help="prompts per generation batch")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="device (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads in all, split between the workers")
    p.add_argument("--workers", type=int, default=None,
                   help="arms trained at a time, each in its own process (default: one per arm up to the CPU "
                        "threads on CPU, 1 on a GPU)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue existing runs in --out")
    group.add_argument("--overwrite", action="store_true", help="delete existing runs in --out first")
    p.set_defaults(func=run_finetune_command)

    s = sub.add_parser("finetune-summary", help="gather finetune runs (tasks × seeds) into one table and figure")
    s.add_argument("runs", nargs="+", help="output directories of `t2mlr experiment finetune`")
    s.add_argument("--out", type=Path, required=True, help="where results.md, results.json and pass_at_1.png go")
    s.set_defaults(func=run_summary_command)


def add_experiment(sub: Any) -> None:
    """Register `finetune` and `finetune-summary` under `t2mlr experiment`."""
    _add_finetune(sub)
