"""`t2mlr experiment NAME --preset P [key=value ...]`: the paper's experiments end to end.

    t2mlr experiment s5-retrieval --preset cpu --out runs/s5                 # ~20 min on 2 CPU cores
    t2mlr experiment s5-retrieval --preset tiny --out /tmp/s5 model.d_forward=8 optim.lr=1e-3
    t2mlr experiment finetune variable-assignment --preset cpu --out runs/ft_va
    t2mlr experiment pathfinding --preset cpu --out runs/pathfinding
    t2mlr experiment retrofit --preset cpu --out runs/retrofit
    t2mlr experiment pretrain --preset cpu --out runs/pretrain
    t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence

A preset is a YAML file under configs/experiments/ (`s5_cpu.yaml`, `finetune_cpu_prosqa_hard.yaml`, ...):
the trainer config of the experiment's T²MLR arm, as `t2mlr train` reads it, plus the experiment's `task:`
section. Dotted `key=value` overrides change either, before or after the options, checked like `t2mlr
train`'s (a misspelt key fails at once, with the nearest valid name). Every arm of the comparison derives
from that one tree (docs/experiments.md). The older flags (--steps, --seed, --threads, ...) are spellings
of overrides and keep working.

Exit codes: 0 done, 1 a training stopped on a non-finite loss, 2 bad input (a config, data, an existing run
directory without --resume or --overwrite).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2mlr.experiments.sections import (
    DESIGNS,
    EXPERIMENT_CONFIGS,
    FinetuneTask,
    PathfindingTask,
    PretrainTask,
    RetrofitTask,
    S5Task,
    preset_config,
    presets,
)
from t2mlr.training.commands import accept_trailing_overrides, add_dry_run_options, parallel_refusal, sizing_refusal
from t2mlr.utils import launched_by_torchrun

if TYPE_CHECKING:
    from t2mlr.training.distributed import DistEnv

__all__ = ["main", "register"]

FINETUNE_TASKS = ("variable-assignment", "prosqa-hard", "gsm-aug", "hotpotqa")


def setting(key: str, value: Any) -> str:
    """A command-line flag as a dotted override (the value written as JSON, which YAML reads back unchanged)."""
    return f"{key}={json.dumps(value)}"


def flag_overrides(args: argparse.Namespace, mapping: dict[str, Sequence[str]]) -> list[str]:
    """The overrides the given flags spell (flag attribute → config keys, then every experiment's --device and
    --parallel: train.device, train.parallel), after the positional overrides."""
    mapping = {**mapping, "device": ("train.device",), "parallel": ("train.parallel",)}
    extra = [setting(key, getattr(args, flag)) for flag, keys in mapping.items() if getattr(args, flag, None) is not None
             for key in keys]
    return [*args.overrides, *extra]


def load(config: str, overrides: Sequence[str], task_class: type) -> tuple[Any, dict[str, Any]]:
    """The task section and the trainer tree of an experiment config with overrides, both checked (all but the
    model section's keys before torch loads: a typo is reported at once)."""
    from t2mlr.training.config import check_before_loading, load_sections

    check_before_loading(config, overrides, data_files=False, sections={"task": task_class}, rules=False)
    tree, sections = load_sections(config, overrides, {"task": task_class})
    return sections["task"], tree


def _guarded(command: str, work: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    """Run an experiment with the shared exit codes; a config error is named as one, before anything trains."""

    def handler(args: argparse.Namespace) -> int:
        from t2mlr.training.config import ConfigError
        from t2mlr.training.exit_codes import BAD_INPUT, run_with_exit_codes

        refusal = (sizing_refusal(args) if hasattr(args, "dry_run") else None) or launch_refusal(command, args)
        if refusal is not None:
            print(f"t2mlr experiment {command}: {refusal}", file=sys.stderr)
            return BAD_INPUT

        def checked() -> Any:
            try:
                return work(args)
            except ConfigError as err:
                raise ValueError(f"config error: {err}") from err

        return run_with_exit_codes(f"t2mlr experiment {command}", checked)[0]

    return handler


def launch_refusal(command: str, args: argparse.Namespace) -> str | None:
    """Why the experiment cannot run as launched, before any config is read or torch loads (None when it can):
    `--parallel ddp|fsdp` outside torchrun (`t2mlr train`'s check), and under torchrun a command without
    `--parallel` (it runs in one process) or more than one worker (the arms train in turn over every rank)."""
    if getattr(args, "dry_run", False):
        return None
    if hasattr(args, "parallel"):
        task = [args.task] if hasattr(args, "task") else []
        out = ["--out", args.out] if getattr(args, "out", None) is not None else []
        refusal = parallel_refusal(args.parallel, ["experiment", command, *task, "--preset", args.preset, *out])
        if refusal is not None:
            return refusal
    if not launched_by_torchrun():
        return None
    if not hasattr(args, "parallel"):
        why = ("a CPU study that trains in its own worker processes" if command == "s5-evidence"
               else "it trains nothing and runs in one process")
        return f"runs without torchrun ({why}): launch it as `t2mlr experiment {command} ...`"
    workers = getattr(args, "workers", None)
    if workers is not None and workers > 1:
        return (f"--workers {workers} under torchrun: the arms train in turn, each over every rank (drop --workers, "
                "or run without torchrun to train arms side by side)")
    return None


@contextlib.contextmanager
def ranks(tree: dict[str, Any]) -> Iterator[DistEnv]:
    """The experiment's one process group under torchrun (every arm trains in it, with train.parallel; see
    `t2mlr.training.distributed.process_group`), or one process. torchrun with train.parallel none is refused:
    every rank would train and write a copy of every arm."""
    from t2mlr.training.config import TrainLoopConfig
    from t2mlr.training.distributed import process_group

    train = TrainLoopConfig(**tree.get("train", {}))  # the train section alone: the data may not be filled in yet
    if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1 and train.parallel == "none":
        raise ValueError("launched by torchrun without data parallelism: pass --parallel ddp or --parallel fsdp")
    with process_group(train.parallel, train.device) as env:
        yield env


DRY_RUN_HELP = ("size every arm the experiment would train (parameters, memory per device, FLOPs, step time, "
                "GPU-hours, their sum) and print the launch line; writes nothing, reads no data, allocates no weights")


def dry_run(args: argparse.Namespace, head: Sequence[str], overrides: Sequence[str], out: Path | str, arms: Any,
            notes: Sequence[str], flags: dict[str, Any] | None = None) -> None:
    """Print the sizing of `arms` (--dry-run); `head`: the experiment's words after `t2mlr` (`experiment finetune
    TASK`), the rest as `launch_words` takes them. Input that cannot be sized is a ValueError (exit 2)."""
    from t2mlr.experiments.dry_run import size_experiment
    from t2mlr.training.sizing import DEFAULT_MFU, SizingError

    arms = list(arms.values()) if isinstance(arms, dict) else list(arms)
    title = f"t2mlr {' '.join(head)} --preset {args.preset}"
    try:
        size = size_experiment(title, launch_words(args, head, overrides, out, flags), arms, args.devices or 1,
                               args.gpu, DEFAULT_MFU if args.mfu is None else args.mfu, notes)
    except SizingError as err:
        raise ValueError(f"--dry-run: {err}") from err
    print(size.to_json() if args.json else size.table())


def launch_words(args: argparse.Namespace, head: Sequence[str], overrides: Sequence[str], out: Path | str,
                 flags: dict[str, Any] | None = None) -> list[str]:
    """The experiment's command line after `t2mlr` (for the launch line): its words, preset and --out, the
    flags that are not overrides, and every override (the flags that spell one included; --parallel as itself)."""
    parallel = getattr(args, "parallel", None)
    if parallel is not None:
        overrides = [word for word in overrides if word != setting("train.parallel", parallel)]
        flags = {**(flags or {}), "--parallel": parallel}
    words = [*head, "--preset", args.preset, "--out", str(out)]
    for flag, value in (flags or {}).items():
        if value is None or value is False:
            continue
        words += [flag] if value is True else [flag, *(map(str, value) if isinstance(value, (list, tuple)) else [str(value)])]
    return [*words, *overrides]


def _set_threads(threads: int | None) -> None:
    """--threads of the experiments that split one thread count between their workers; under torchrun without
    it, `t2mlr train`'s choice (the free cores shared among this machine's ranks), not torch's every core per rank."""
    if threads is None and launched_by_torchrun():
        from t2mlr.training.commands import choose_threads

        threads = choose_threads(None, None)[0]
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def _common(p: argparse.ArgumentParser, prefix: str, default: str, out: Path | None, resume: bool = True,
            choices: Sequence[str] | None = None) -> None:
    p.add_argument("--preset", choices=choices or presets(prefix), default=default,
                   help=f"configs/experiments/{prefix}_<preset>.yaml (default: {default})")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="dotted overrides of the preset's config: trainer keys (optim.lr=1e-3, model.d_forward=8) or "
                        "the experiment's task section (task.train_size=100)")
    p.add_argument("--out", type=Path, default=out,
                   help="output directory " + ("(required unless --dry-run)" if out is None else f"(default: {out})"))
    if resume:
        group = p.add_mutually_exclusive_group()
        group.add_argument("--resume", action="store_true",
                           help="continue existing runs in --out from their latest checkpoints (finished ones are only "
                                "re-evaluated)")
        group.add_argument("--overwrite", action="store_true", help="delete existing runs in --out first")
    p.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default=None,
                   help="data parallelism under torchrun (train.parallel of every arm): `torchrun --nproc_per_node N "
                        "-m t2mlr experiment ... --parallel fsdp` trains each arm in turn over every rank and shares "
                        "the evaluation out (docs/scale.md); ddp and fsdp need torchrun")
    add_dry_run_options(p, DRY_RUN_HELP)
    accept_trailing_overrides(p)


# ---------------------------------------------------------------------------------------------- S5-Retrieval


def _run_s5(args: argparse.Namespace) -> Any:
    if args.checkpoint_every is not None and args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got {args.checkpoint_every}")
    overrides = flag_overrides(args, {"steps": ("train.max_steps", "task.baseline_steps"), "seed": ("train.seed",),
                                      "checkpoint_every": ("checkpoint.every",), "threads": ("task.torch_threads",),
                                      "train_recurrence": ("model.train_recurrence",), "d_forward": ("model.d_forward",),
                                      "d_backward": ("model.d_backward",)})
    task, tree = load(preset_config("s5", args.preset), overrides, S5Task)
    model = tree["model"]
    if model.get("train_recurrence") == "exact" and (args.d_forward is not None or args.d_backward is not None):
        raise ValueError("--d-forward / --d-backward set the Jacobi training depths; T²MLR trains on the exact path "
                         "here (pass --train-recurrence jacobi)")
    if not 1 <= int(model["d_backward"]) <= int(model["d_forward"]):
        raise ValueError(f"need 1 <= --d-backward <= --d-forward, got d_forward={model['d_forward']}, "
                         f"d_backward={model['d_backward']}")
    from t2mlr.experiments import s5  # checked: now the heavy part

    if args.dry_run:
        arms, notes = s5.dry_run_arms(task, tree, args.out, tuple(args.models))
        models = None if tuple(args.models) == s5.MODEL_NAMES else args.models
        return dry_run(args, ["experiment", "s5-retrieval"], overrides, args.out, arms, notes, {"--models": models})
    with ranks(tree):
        return s5.run(args.preset, task, tree, args.out, tuple(args.models), args.resume, args.overwrite, args.workers)


def _add_s5(sub: Any) -> None:
    p = sub.add_parser("s5-retrieval", help="S5-Retrieval: T²MLR vs matched Transformer and LSTM",
                       description=S5_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, "s5", "cpu", Path("runs/s5"))
    p.add_argument("--models", nargs="+", default=["t2mlr", "transformer", "lstm"], metavar="MODEL",
                   help="models to train (default: t2mlr transformer lstm, the preset's three; gru and rnn are the "
                        "GRU and vanilla-RNN baselines, matched like the LSTM); any arm of "
                        "`t2mlr params` joins them at T²MLR's parameter count: t2mlr:S-E (another placement), "
                        "t2mlr:S-E:exact or t2mlr:S-E:jacobi:F:B (T²MLR on its own training path), "
                        "looped:full:K, looped:S-E:K, pause:P (the baselines train the Transformer's steps), "
                        "transformer:compute-matched (the matched Transformer for T²MLR's measured training "
                        "compute: T²MLR's steps × the preset's task.compute_matched_ratio)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="training device (train.device)")
    p.add_argument("--train-recurrence", choices=("exact", "jacobi"), default=None,
                   help="T²MLR's training path (model.train_recurrence; cpu: exact); evaluation is always exact")
    p.add_argument("--d-forward", type=int, default=None, help="Jacobi training d_forward (model.d_forward)")
    p.add_argument("--d-backward", type=int, default=None, help="Jacobi training d_backward (model.d_backward)")
    p.add_argument("--steps", type=int, default=None, help="every model's training steps (train.max_steps, "
                                                           "task.baseline_steps)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of every run and of the evaluation (task.torch_threads; default 1); part of "
                        "the arithmetic, recorded in results.json")
    p.add_argument("--workers", type=int, default=None,
                   help="models trained at a time, each in its own process (default: one per model up to the CPU "
                        "threads on CPU, 1 on a GPU)")
    p.add_argument("--seed", type=int, default=None, help="seed of the data and of training (train.seed; default 0)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint every STEPS steps, 0 only at the end (checkpoint.every); changes no result")
    p.set_defaults(func=_guarded("s5-retrieval", _run_s5))


S5_HELP = """S5-Retrieval (paper §5): T²MLR against a parameter-matched Transformer and LSTM.

    t2mlr experiment s5-retrieval --preset cpu --out runs/s5      # ~20 min on 2 CPU cores
    t2mlr experiment s5-retrieval --preset paper --out runs/s5    # GPU, paper settings
    t2mlr experiment s5-retrieval --preset tiny --out /tmp/s5     # seconds: pipeline check only
    t2mlr experiment s5-retrieval --preset cpu --train-recurrence jacobi --d-forward 16 --d-backward 4 --out runs/s5_jacobi
    t2mlr experiment s5-retrieval --preset cpu --models t2mlr transformer looped:full:2 pause:2 \\
        transformer:compute-matched --out runs/s5_arms

Writes OUT/results.md, OUT/results.json, OUT/accuracy_vs_length.png, the data under OUT/data and one
training run directory per model. On a CPU the models train side by side, one worker process each up to the
CPU threads (--workers); on a GPU in turn. Workers end with the command: killing it (even with SIGKILL)
leaves no training behind. Every model checkpoints as it trains (cpu: every 250 steps), and --resume
continues each run from its latest checkpoint exactly as if it had never stopped. Every run and the
evaluation compute on the preset's fixed number of torch threads (task.torch_threads, 1), so a seed's numbers
are the same whatever --workers, the machine's load, or an interruption; only the times change. Exit codes:
0 done, 1 training stopped (non-finite loss), 2 bad input or an existing run directory.
"""


# ---------------------------------------------------------------------------------------------- the evidence study

S5_EVIDENCE_HELP = """The S5-Retrieval evidence study (docs/s5_evidence.md), resumable:

    t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence --report results/s5_evidence

Measures every arm's training-step and decoding cost side by side (once, OUT/costs/), trains every arm for
every seed (cpu: T²MLR exact, Jacobi (16,4) and (4,2); the matched Transformer at the preset's steps and
compute-matched; looped full ×2 and ×3; pause ×2; and on the 4-block cpu-deep variant T²MLR(2,3), looped
2-3 ×3 and the matched Transformer), evaluates each seed (OUT/seed_S/PRESET/results.md), runs the gate,
gradient-fidelity and Jacobi-depth analyses on the trained T²MLR models, and writes one report with every
seed's numbers, the mean and spread per arm, and the figures. The same command continues an interrupted
study; finished runs are not retrained. Overrides apply to every variant's config. Exit codes: 0 done
(failed runs are recorded in the report), 2 bad input.
"""


def _run_s5_evidence(args: argparse.Namespace) -> Any:
    from t2mlr.training.config import check_before_loading

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if args.checkpoint_every is not None and args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 (0: only at the end), got {args.checkpoint_every}")
    overrides = flag_overrides(args, {"steps": ("train.max_steps", "task.baseline_steps"),
                                      "checkpoint_every": ("checkpoint.every",)})
    for variant in DESIGNS.get(args.preset, ()):  # a typo is reported before torch loads
        check_before_loading(preset_config("s5", variant.preset), overrides, data_files=False, sections={"task": S5Task},
                             rules=False)
    from t2mlr.experiments.s5_evidence import dry_run_arms, run_study  # checked: now the heavy part

    if args.dry_run:
        if args.devices is not None and args.devices > 1:
            raise ValueError(f"--devices {args.devices}: the study trains in one process and its own workers, not "
                             "under torchrun; size it on one device (or size its arms with s5-retrieval --models)")

        arms, notes = dry_run_arms(args.preset, args.seeds, args.out, overrides)
        return dry_run(args, ["experiment", "s5-evidence"], overrides, args.out, arms, notes,
                       {"--seeds": args.seeds, "--report": args.report})
    return run_study(args.preset, args.seeds, args.out, report=args.report, workers=args.workers,
                     analyses=not args.skip_analyses, overrides=overrides, cost_rounds=args.cost_rounds,
                     decode_rounds=args.decode_rounds, report_only=args.report_only)


def _add_s5_evidence(sub: Any) -> None:
    p = sub.add_parser("s5-evidence", help="S5-Retrieval evidence study: Jacobi vs exact training, looped and pause "
                       "baselines, the paper's analyses, over seeds; one report",
                       description=S5_EVIDENCE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("cpu", "tiny"), default="cpu",
                   help="the study's design: cpu (with its 4-block cpu-deep variant) or tiny (pipeline check)")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="dotted overrides of every variant")
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
    p.add_argument("--report-only", action="store_true",
                   help="write the report again from the finished study under OUT (every seed's results, the "
                        "analyses, the costs): nothing is trained, evaluated or measured")
    p.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)  # tests: every arm's steps
    p.add_argument("--checkpoint-every", type=int, default=None, help=argparse.SUPPRESS)  # tests
    p.add_argument("--cost-rounds", type=int, default=21, help="paired rounds of the training-cost measurement")
    p.add_argument("--decode-rounds", type=int, default=11, help="paired rounds of the decoding-cost measurement")
    add_dry_run_options(p, DRY_RUN_HELP)
    accept_trailing_overrides(p)
    p.set_defaults(func=_guarded("s5-evidence", _run_s5_evidence))


# ---------------------------------------------------------------------------------------------- finetunes

FINETUNE_HELP = """The reasoning finetunes (paper §4.3): every arm on one task, pass@1.

    t2mlr experiment finetune variable-assignment --preset cpu --out runs/ft_va
    t2mlr experiment finetune prosqa-hard --preset cpu --out runs/ft_prosqa
    t2mlr experiment finetune gsm-aug --preset paper --variant symbolic --data whynlp/gsm8k-aug --from CKPTS --out runs/ft_gsm
    t2mlr experiment finetune hotpotqa --preset paper --data hotpotqa_cot/ --retrofit MODEL --out runs/ft_hotpot
    t2mlr experiment finetune TASK --arms t2mlr:13-18,t2mlr:1-30,transformer,looped:9-22:3,pause:2 ...

The preset is configs/experiments/finetune_<preset>_<task>.yaml. Writes OUT/results.md, OUT/results.json,
OUT/pass_at_1.png, OUT/predictions.jsonl, the data under OUT/data and one training run directory per arm.
`t2mlr experiment finetune-summary RUN... --out DIR` gathers several runs (tasks, seeds) into one table and
one figure (one bar group per task, one bar per arm).

--from takes either one directory holding a subdirectory per arm (named like the arm with ':' replaced by
'_', e.g. t2mlr_13-18/, transformer/; a trainer run directory's `final/` is used when present), or
ARM=DIR pairs, one per arm. Exit codes: 0 done, 1 training stopped (non-finite loss), 2 bad input.
"""


# The flags of the finetunes (and of the pathfinding experiment, a finetune) that spell config overrides
FINETUNE_FLAGS = {"steps": ("train.max_steps",), "seed": ("train.seed",), "train_size": ("task.train_size",),
                  "eval_size": ("task.eval_size",), "prefill": ("task.prefill",),
                  "eval_batch_size": ("eval.batch_size",), "recurrence_mask_policy": ("model.recurrence_mask_policy",)}


def _run_finetune(args: argparse.Namespace) -> Any:
    from t2mlr.tasks.reasoning import check_data_source, get_task

    def has_config(task: str) -> bool:
        return (EXPERIMENT_CONFIGS / f"{Path(preset_config('finetune', args.preset, task)).name}.yaml").is_file()

    if not has_config(args.task):
        covered = [t for t in FINETUNE_TASKS if has_config(t)]
        raise ValueError(f"the {args.preset} preset covers {', '.join(covered)}; {args.task} needs --preset paper (GPU) "
                         "or tiny")
    mask = None if args.prompt_recurrence_mask is None else ("mask" if args.prompt_recurrence_mask else "all")
    args.recurrence_mask_policy = mask
    overrides = flag_overrides(args, FINETUNE_FLAGS)
    if args.out is None and not args.dry_run:
        raise ValueError("--out is required (the output directory), unless --dry-run")
    if get_task(args.task).needs_data and not args.dry_run:  # a missing data file is reported before torch loads
        check_data_source(args.task, args.data, args.variant)
    task, tree = load(preset_config("finetune", args.preset, args.task), overrides, FinetuneTask)
    from t2mlr.experiments import finetune  # checked: now the heavy part

    plan = finetune.make_plan(args.preset, task, tree, args.arms, args.from_, args.retrofit, args.data, args.variant,
                              args.prefill_depth, dry_run=args.dry_run)
    if args.dry_run:
        out = args.out or Path(f"runs/finetune_{args.preset}_{args.task.replace('-', '_')}")
        arms, notes = finetune.dry_run_arms(plan, out)
        if get_task(args.task).needs_data:
            notes.insert(0, f"the {args.task} data source (--data) is checked when the experiment runs")
        if plan.start.kind == "shape":
            notes.insert(0, "launch: CHECKPOINTS stands for the arms' pretrained checkpoints (or pass --retrofit MODEL)")
        checkpoints = args.from_ or (["CHECKPOINTS"] if plan.start.kind == "shape" else None)
        flags = {"--arms": args.arms, "--from": checkpoints, "--retrofit": args.retrofit, "--data": args.data,
                 "--variant": args.variant, "--prefill-depth": args.prefill_depth}
        return dry_run(args, ["experiment", "finetune", args.task], overrides, out, arms, notes, flags)
    _set_threads(args.threads)
    with ranks(tree):
        return finetune.run(plan, args.out, resume=args.resume, overwrite=args.overwrite, workers=args.workers)


def _run_finetune_summary(args: argparse.Namespace) -> Any:
    from t2mlr.experiments.finetune import write_summary

    return write_summary([Path(p) for p in args.runs], args.out)  # a broken results.json: a ValueError, exit 2


def _add_finetune_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags every finetune-run command shares: steps, seed, sizes, device, threads and workers."""
    p.add_argument("--steps", type=int, default=None, help="every arm's training steps (train.max_steps)")
    p.add_argument("--seed", type=int, default=None, help="seed of the data and of training (train.seed; default 0)")
    p.add_argument("--train-size", type=int, default=None, help="training records (task.train_size)")
    p.add_argument("--eval-size", type=int, default=None, help="evaluation problems (task.eval_size)")
    p.add_argument("--eval-batch-size", type=int, default=None, help="prompts per generation batch (eval.batch_size)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="device (train.device)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads in all, split between the workers")
    p.add_argument("--workers", type=int, default=None,
                   help="arms trained at a time, each in its own process (default: one per arm up to the CPU "
                        "threads on CPU, 1 on a GPU)")


def _add_finetune(sub: Any) -> None:
    p = sub.add_parser("finetune", help="reasoning finetunes: every arm on one task, pass@1",
                       description=FINETUNE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=FINETUNE_TASKS, help="the task")
    _common(p, "finetune", "cpu", None, choices=("cpu", "paper", "tiny"))
    p.add_argument("--arms", default=None,
                   help="comma-separated arms, e.g. t2mlr:13-18,t2mlr:1-30,transformer,looped:9-22:3,pause:2 "
                        "(default: the preset's task.arms)")
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
                   help="T²MLR fuses its state into target tokens only, the prompt still writes it "
                        "(model.recurrence_mask_policy=mask); default: the preset's (off)")
    p.add_argument("--prefill", choices=("exact", "jacobi"), default=None,
                   help="T²MLR prompt prefill in evaluation (task.prefill; default: exact)")
    p.add_argument("--prefill-depth", type=int, default=None, help="Jacobi prefill iterations (default: d_forward)")
    _add_finetune_run_flags(p)
    p.set_defaults(func=_guarded("finetune", _run_finetune))

    s = sub.add_parser("finetune-summary", help="gather finetune runs (tasks × seeds) into one table and figure")
    s.add_argument("runs", nargs="+", help="output directories of `t2mlr experiment finetune`")
    s.add_argument("--out", type=Path, required=True, help="where results.md, results.json and pass_at_1.png go")
    s.set_defaults(func=_guarded("finetune-summary", _run_finetune_summary))


# ---------------------------------------------------------------------------------------------- pathfinding

PATHFINDING_HELP = """The authors' release's pathfinding task: the unique shortest path of a directed graph, T²MLR on
vs off, scored greedy pass@1 with any valid shortest path accepted.

    t2mlr experiment pathfinding --preset cpu --seed 0 --threads 1 --out runs/pathfinding_seed0   # CPU, from scratch
    t2mlr experiment pathfinding --preset paper --out runs/pathfinding   # GPU: SmolLM2-135M retrofit, as the release
    t2mlr experiment pathfinding --preset paper --data data/pathfinding --out runs/pathfinding   # the release's files
    t2mlr experiment pathfinding --preset tiny --out /tmp/pathfinding    # pipeline check only

The preset is configs/experiments/pathfinding_<preset>.yaml. --data takes a .jsonl file (or the release's .json
list) whose last task.eval_size rows are held out, or a directory with train and test splits (train.jsonl /
test.jsonl, or the release's pathfinding_train.json / pathfinding_test.json); every row is checked (a path
exists, exactly one is shortest, the edges are well formed, the answer is that path) and a bad one stops the
run with its file:line, exit 2. Writes what `t2mlr experiment finetune` writes (results.md, results.json,
pass_at_1.png, predictions.jsonl, data/, one run directory per arm); `t2mlr experiment finetune-summary` gathers
seeds. Exit codes: 0 done, 1 training stopped (non-finite loss), 2 bad input.
"""


def _run_pathfinding(args: argparse.Namespace) -> Any:
    args.prefill = args.recurrence_mask_policy = None  # flags of the finetunes this command does not take
    overrides = flag_overrides(args, FINETUNE_FLAGS)
    if args.out is None and not args.dry_run:
        raise ValueError("--out is required (the output directory), unless --dry-run")
    if args.data is not None and not Path(args.data).exists():
        raise ValueError(f"--data {args.data}: no such file or directory")
    task, tree = load(preset_config("pathfinding", args.preset), overrides, PathfindingTask)
    from t2mlr.experiments import finetune, pathfinding  # checked: now the heavy part
    plan = pathfinding.plan(args.preset, task, tree, args.arms, retrofit=args.retrofit, data=args.data,
                            dry_run=args.dry_run)
    if args.dry_run:
        out = args.out or Path(f"runs/pathfinding_{args.preset}")
        arms, notes = finetune.dry_run_arms(plan, out)
        if plan.start.kind == "shape":  # the finetunes' note on this asks for --from or --retrofit: not needed here
            notes = [f"start: the run retrofits {task.pretrained} (task.pretrained); sized at the preset's declared "
                     "backbone, nothing downloaded", *(n for n in notes if not n.startswith("start:"))]
        flags = {"--arms": args.arms, "--retrofit": args.retrofit, "--data": args.data}
        return dry_run(args, ["experiment", "pathfinding"], overrides, out, arms, notes, flags)
    _set_threads(args.threads)
    with ranks(tree):
        return finetune.run(plan, args.out, resume=args.resume, overwrite=args.overwrite, workers=args.workers)


def _add_pathfinding(sub: Any) -> None:
    p = sub.add_parser("pathfinding", help="the release's pathfinding task: T²MLR on vs off, greedy pass@1",
                       description=PATHFINDING_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, "pathfinding", "cpu", None)
    p.add_argument("--arms", default=None, help="comma-separated arms, e.g. t2mlr:2-3,transformer (default: the "
                                                "preset's task.arms)")
    p.add_argument("--data", default=None, help="a pathfinding .jsonl/.json file or a directory of train and test "
                                                "splits (the release's files too) instead of generated rows")
    p.add_argument("--retrofit", default=None, metavar="MODEL",
                   help="start every arm from this pretrained model (default: the paper preset's task.pretrained)")
    _add_finetune_run_flags(p)
    p.set_defaults(func=_guarded("pathfinding", _run_pathfinding))


# ---------------------------------------------------------------------------------------------- retrofit

RETROFIT_HELP = """The paper's retrofit experiment: T²MLR retrofitted into a pretrained model, finetuned beside the
unchanged model, both scored on held-out problems.

    t2mlr experiment retrofit --preset cpu --out runs/retrofit      # SmolLM2-135M-Instruct, ~15 min/seed, 1 core
    t2mlr experiment retrofit --preset paper --out runs/retrofit \\
        --train-path OpenMathReasoning.parquet --eval-path gsm8k_test.jsonl   # GPU, the paper's setting
    t2mlr experiment retrofit --preset tiny --out /tmp/retrofit     # pipeline check only

Steps: (1) load the pretrained model once (GGUF dequantised) and save it with its tokenizer under OUT/base,
so both arms start from the very same weights; (2) write the finetuning and held-out evaluation records
under OUT/data; (3) evaluate the pretrained model before finetuning; (4) finetune the unchanged model
(`transformer`) and its T²MLR(l_start, l_end) retrofit (`t2mlr`) with the project trainer, the same rows in
the same order, steps, optimiser and seed, prompts masked from the loss; (5) evaluate both by batched greedy
generation (exact path for T²MLR). Writes OUT/results.md, OUT/results.json, OUT/predictions/<model>.jsonl,
OUT/retrofit.png and one training run directory per arm (OUT/runs/<arm>, final/ loads with `t2mlr generate`).

Scoring (`t2mlr.tasks.scoring`): GSM-format answers (the generated problems, GSM8K) by both of
lm-evaluation-harness's GSM8K metrics, strict-match (the answer after "####" or "The answer is"; the headline
number) and flexible-extract (the reply's last number, which also credits a reply cut off before its answer
when the last number it copied happens to be the answer); MATH-500 by the boxed answer after MATH's
normalisation (`--eval math500 --eval-path FILE`).

    t2mlr experiment retrofit-summary runs/retrofit/seed0 runs/retrofit/seed1 --out runs/retrofit

re-scores the saved replies of several runs (seeds) with every metric and writes one table per metric
(summary.md, summary.json).
"""


def _run_retrofit(args: argparse.Namespace) -> Any:
    args.recurrence_mask_policy = "mask" if args.mask_prompt_recurrence else None
    overrides = flag_overrides(args, {"seed": ("train.seed",), "steps": ("train.max_steps",), "source": ("model.pretrained",),
                                      "gguf_file": ("model.gguf_file",), "train_path": ("task.train_path",),
                                      "eval": ("task.eval_data",), "eval_path": ("task.eval_path",),
                                      "recurrence_mask_policy": ("model.recurrence_mask_policy",)})
    task, tree = load(preset_config("retrofit", args.preset), overrides, RetrofitTask)
    from t2mlr.experiments import retrofit  # checked: now the heavy part
    if args.dry_run:
        arms, notes = retrofit.dry_run_arms(task, tree, args.out)
        return dry_run(args, ["experiment", "retrofit"], overrides, args.out, arms, notes)
    _set_threads(args.threads)
    with ranks(tree) as env:
        retrofit.run(args.preset, task, tree, args.out, overwrite=args.overwrite)
        if env.is_main:
            print((args.out / "results.md").read_text(encoding="utf-8"))


def _run_retrofit_summary(args: argparse.Namespace) -> Any:
    from t2mlr.experiments.retrofit import write_summary

    write_summary(args.runs, args.out)  # a broken results.json: JSONDecodeError, a ValueError (exit 2)
    print((args.out / "summary.md").read_text(encoding="utf-8"))


def _add_retrofit(sub: Any) -> None:
    p = sub.add_parser("retrofit", help="retrofit T²MLR into a pretrained model, finetune it and the base, compare",
                       description=RETROFIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, "retrofit", "cpu", Path("runs/retrofit"), resume=False)
    p.add_argument("--seed", type=int, default=None, help="seed of the data and of training (train.seed; default 0)")
    p.add_argument("--steps", type=int, default=None, help="both arms' finetuning steps (train.max_steps)")
    p.add_argument("--source", default=None, help="the pretrained model (model.pretrained: hub id, directory, .gguf, shortcut)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --source (model.gguf_file)")
    p.add_argument("--train-path", default=None, help="OpenMathReasoning jsonl/parquet (task.train_path; paper preset)")
    p.add_argument("--eval", choices=("arithmetic", "gsm8k", "math500"), default=None,
                   help="evaluation data (task.eval_data): arithmetic (generated), gsm8k or math500 (a local "
                        "--eval-path file); default: the preset's (cpu: arithmetic, paper: gsm8k)")
    p.add_argument("--eval-path", default=None,
                   help="GSM8K test or MATH-500 jsonl/parquet (task.eval_path; the paper preset evaluates every row)")
    p.add_argument("--mask-prompt-recurrence", action="store_true",
                   help="the prompt's tokens skip the fusion, they still write the recurrent state "
                        "(model.recurrence_mask_policy=mask)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="training device (train.device)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--overwrite", action="store_true", help="replace the results and runs in a non-empty --out")
    p.set_defaults(func=_guarded("retrofit", _run_retrofit))

    summary = sub.add_parser("retrofit-summary", help="re-score retrofit runs (seeds) with every metric, one table each")
    summary.add_argument("runs", nargs="+", type=Path, help="output directories of `t2mlr experiment retrofit`")
    summary.add_argument("--out", type=Path, required=True, help="where summary.md and summary.json go")
    summary.set_defaults(func=_guarded("retrofit-summary", _run_retrofit_summary))


# ---------------------------------------------------------------------------------------------- pretraining

PRETRAIN_HELP = """Pretrain T²MLR with a middle block, T²MLR over every block and the parameter-matched Transformer on
offline English text (the pipeline of the paper's 135M comparison at a CPU's scale; no hub).

    t2mlr experiment pretrain --preset cpu --out runs/pretrain     # ~10 min of CPU time (results/pretrain_cpu)
    t2mlr experiment pretrain --preset tiny --out /tmp/pretrain    # seconds: pipeline check only
    t2mlr experiment pretrain --preset gpu --out runs/pretrain_gpu # ~7 min on one H100/H200 (code, 160 s per arm)

The corpus: the Python documentation sources of Debian's python3.11-doc package (`apt-get install
python3.11-doc`), split into train and held-out validation documents by a hash of their ids, a byte-level BPE
trained on the train split, both splits tokenized into shards; `--corpus DIR` reuses a prepared corpus
(train.jsonl and validation.jsonl from `t2mlr corpus prepare-offline`). The validation loss of each model on
the held-out documents: T²MLR on the exact and on the Jacobi path, the Transformer on its only path. Writes
OUT/results.md, OUT/results.json, OUT/loss_curves.png, the data under OUT/data and one run directory per
model. --resume continues interrupted runs; exit codes: 0 done, 1 training stopped (a non-finite loss), 2 bad
input or an existing run directory.
"""


def _run_pretrain(args: argparse.Namespace) -> Any:
    overrides = flag_overrides(args, {"steps": ("train.max_steps",)})
    task, tree = load(preset_config("pretrain", args.preset), overrides, PretrainTask)
    from t2mlr.experiments import pretrain  # checked: now the heavy part
    if args.dry_run:
        arms, notes = pretrain.dry_run_arms(tree, args.out, task.arms)
        return dry_run(args, ["experiment", "pretrain"], overrides, args.out, arms, notes, {"--corpus": args.corpus})
    _set_threads(args.threads)
    with ranks(tree) as env:
        payload = pretrain.run(args.preset, task, tree, args.out, corpus=args.corpus, workers=args.workers,
                               resume=args.resume, overwrite=args.overwrite)
    if env.is_main:
        for row in payload["results"]:
            print(json.dumps({k: row[k] for k in ("model", "path", "loss", "ppl")}))
        print(f"wrote {Path(args.out) / 'results.md'}")


def _add_pretrain(sub: Any) -> None:
    p = sub.add_parser("pretrain", help="pretrain T²MLR middle / full and the matched Transformer on offline English text",
                       description=PRETRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, "pretrain", "cpu", Path("runs/pretrain"))
    p.add_argument("--corpus", type=Path, default=None,
                   help="a prepared corpus directory (train.jsonl, validation.jsonl) instead of building one")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="training device (train.device; default cpu)")
    p.add_argument("--steps", type=int, default=None, help="the training steps (train.max_steps)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads in all, split between the workers")
    p.add_argument("--workers", type=int, default=None,
                   help="models trained at a time (default: one per model up to the CPU threads)")
    p.set_defaults(func=_guarded("pretrain", _run_pretrain))


# ---------------------------------------------------------------------------------------------- the group


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `experiment` group to a main CLI's subparsers; every leaf sets `func`."""
    parser = subparsers.add_parser("experiment", help="run a paper experiment end to end", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for add in (_add_s5, _add_s5_evidence, _add_finetune, _add_pathfinding, _add_retrofit, _add_pretrain):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone: `python -m t2mlr.experiments.commands experiment s5-retrieval --preset tiny`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
