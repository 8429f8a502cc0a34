"""Several training runs of one comparison ("arms") into one folder: in turn, or side by side in worker
processes, every one an ordinary run directory that checkpoints and resumes like a `t2mlr train` run.

Every experiment and every analysis that trains goes through `train_arms`. An arm is a name, a label and a
full trainer config; arms of one comparison are one config tree with dotted overrides (`arm_from_tree`:
`model.l_start=1 model.l_end=4`), or, for the baselines, the same tree with the model section of the
baseline matched to the tree's T²MLR parameter count (`matched_arm`: the Transformer, the LSTM, GRU, RNN, looped and
pause-token models, docs/semantics.md §8).

Side by side: on a CPU, models this small do not get faster with a second torch thread (measured on 2
cores: 3.4 steps/s with two threads, 3.5 with one while a second run shares the machine), so two
single-thread processes finish two trainings in about half the time of one two-thread process. Workers
are fresh (spawned) processes; a run that fails lets those under way finish (their checkpoints stay
resumable) and cancels the rest. With `keep_going`, a run that stops on a non-finite loss is reported
beside the finished ones instead (a long study records a failed seed and goes on). Under torchrun the arms
train in turn, each over every rank with the trainer's own data parallelism (`train.parallel`).

Reproducibility: an arm may fix its torch CPU threads (`Arm.threads`): the count sets the float summation
order of the CPU kernels, so fixed, a seed's numbers do not depend on the schedule, the load or the number
of workers. Workers die with the parent (Linux: the kernel's parent-death signal, immediate even inside a
long torch call; elsewhere a thread polls the parent's pid), so a killed command leaves nothing training
unseen; checkpoints are written atomically and a resumed run cuts its metrics back to its checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig

from t2mlr.baselines.matching import (
    ModelSpec,
    matched_arms,
    matched_baseline_config,
    matched_recurrent_baseline,
    matched_transformer_config,
    t2mlr_parameter_count,
)
from t2mlr.baselines.recurrent import RECURRENT_CELLS
from t2mlr.model import T2MLRConfig
from t2mlr.model.configuration import build_base_config
from t2mlr.training.architectures import checkpointing_refusal
from t2mlr.training import distributed as dist_utils
from t2mlr.training.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_tree,
    load_tree,
)
from t2mlr.training.data import eval_batches
from t2mlr.training.model_factory import base_config, build_model, load_initial_weights
from t2mlr.training.trainer import FINAL_DIR, NonFiniteLossError, train
from t2mlr.utils import exit_when_orphaned, resolve_device

__all__ = ["Arm", "TrainedArm", "arm_from_tree", "base_section", "claim_run_dirs", "config_tree", "fixed_threads",
           "load_trained", "matched_arm", "model_section", "resolve_workers", "t2mlr_of", "train_arms",
           "validation_batches"]

PLAIN_BASELINES = ("transformer", *RECURRENT_CELLS)  # the baselines `matched_arm` names by a word
_NOT_BASE_KEYS = {"transformers_version", "architectures", "_name_or_path", "dtype"}


@dataclass(frozen=True)
class Arm:
    """One run of a comparison: its name (the key in results), its label in tables, its full trainer config,
    its run directory under OUT (default: the name) and the torch CPU threads it trains on (None: this
    process's own in turn, the parent's split evenly between the workers side by side)."""

    name: str
    label: str
    config: TrainConfig
    directory: str | None = None
    threads: int | None = None

    @property
    def dir_name(self) -> str:
        return self.directory or self.name


@dataclass(frozen=True)
class TrainedArm:
    """A finished arm: its run directory, its last checkpoint and its optimizer steps' seconds over every attempt
    (the trainer's `step_seconds`: checkpoints, evaluation and interruptions left out)."""

    arm: Arm
    run_dir: Path
    checkpoint: Path
    seconds: float

    @property
    def model_dir(self) -> Path:
        return self.run_dir / FINAL_DIR


# ---------------------------------------------------------------------------------------------- arms


def config_tree(config: str | Path, overrides: Sequence[str] = (), t2mlr: bool = False) -> dict[str, Any]:
    """The plain tree of a YAML config or preset with dotted overrides applied (checked by building it
    once); arms add their own overrides on top. `t2mlr`: the comparison derives its arms from a T²MLR model."""
    tree = load_tree(config, overrides)
    cfg = config_from_tree(tree)
    if t2mlr and cfg.model.arch != "t2mlr":
        raise ConfigError(f"{config}: model.arch is {cfg.model.arch!r}; the arms of this comparison derive from a "
                          "T²MLR config (model.arch: t2mlr)")
    return tree


def arm_from_tree(tree: dict[str, Any], name: str, label: str, overrides: Sequence[str] = (), **arm: Any) -> Arm:
    """An arm whose config is `tree` with `overrides` (dotted key=value) applied."""
    return Arm(name, label, config_from_tree(apply_overrides(tree, list(overrides))), **arm)


def base_section(config: PretrainedConfig) -> dict[str, Any]:
    """The trainer's `model.base` dict that rebuilds `config`: its non-default fields and its model type
    (bookkeeping fields that transformers adds on save are left out)."""
    fields = {k: v for k, v in config.to_diff_dict().items() if k not in _NOT_BASE_KEYS}
    fields["model_type"] = config.model_type
    return fields


def model_section(spec: ModelSpec, config: PretrainedConfig, t2mlr_settings: dict[str, Any]) -> dict[str, Any]:
    """The trainer's `model:` section that builds a comparison arm from scratch (`config`: the arm as
    `t2mlr.baselines.matching.matched_arms` built it); T²MLR arms add `t2mlr_settings` (depths, paths)."""
    if spec.kind == "t2mlr":
        return {"arch": "t2mlr", "base": base_section(config.base_config), "l_start": config.l_start,
                "l_end": config.l_end, **t2mlr_settings}
    if spec.kind == "transformer":
        return {"arch": "transformer", "base": base_section(config)}
    settings = {name: getattr(config, name) for name in type(config).settings_fields()}
    return {"arch": spec.kind, "base": base_section(config.base_config), **settings}


def t2mlr_of(cfg: TrainConfig) -> T2MLRConfig:
    """The T²MLR model config of a trainer config built from `model.base` (what matched baselines match)."""
    if cfg.model.arch != "t2mlr" or cfg.model.base is None:
        raise ConfigError(f"a matched baseline needs a T²MLR model built from model.base; got model.arch "
                          f"{cfg.model.arch!r}" + (" with model.pretrained" if cfg.model.pretrained else ""))
    return T2MLRConfig(base_config=build_base_config(cfg.model.base), **cfg.model.settings)


def matched_arm(tree: dict[str, Any], name: str, spec: ModelSpec | str, label: str | None = None,
                overrides: Sequence[str] = (), lstm_layers: int = 4, **arm: Any) -> Arm:
    """The baseline `spec` ("transformer", a recurrent cell "lstm", "gru" or "rnn" of `lstm_layers` layers, or a
    `ModelSpec`: looped, pause, another T²MLR placement) for the T²MLR model of `tree`, matched to its parameter
    count, with everything else of `tree`.

    A tree that retrofits a pretrained model has no matched twin with pretrained weights: its "transformer"
    arm is the pretrained base itself, trained the same way. `model.activation_checkpointing` carries over to
    the baselines that run blocks several times per step (the others have nothing it would save)."""
    if isinstance(spec, str) and spec not in PLAIN_BASELINES:
        raise ValueError(f"unknown baseline {spec!r}: use one of {', '.join(PLAIN_BASELINES)} or a ModelSpec")
    cfg = config_from_tree(tree)
    if spec == "transformer" and cfg.model.pretrained is not None:
        model = {"arch": "transformer", "pretrained": cfg.model.pretrained, "gguf_file": cfg.model.gguf_file}
        label = label or "Transformer (the pretrained base, fine-tuned the same way)"
    else:
        t2mlr = t2mlr_of(cfg)
        if isinstance(spec, str):
            matched = _matched_plain(t2mlr, spec, lstm_layers)
            model = {"arch": "transformer", "base": base_section(matched)}
            kind = "Transformer" if spec == "transformer" else matched.cell_label
            label = label or f"{kind} (matched, hidden {matched.hidden_size})"
        else:
            settings = {k: cfg.model.settings[k] for k in ("d_forward", "d_backward", "train_recurrence",
                                                           "eval_recurrence")}
            _, (built,) = matched_arms(t2mlr.base_config, [spec], **settings)
            model = model_section(spec, built.config, {**settings, **spec.path_settings()})
            label = label or spec.label
    if cfg.model.activation_checkpointing and checkpointing_refusal(model["arch"], model) is None:
        model["activation_checkpointing"] = True  # kept where the baseline repeats blocks (looped, a T²MLR twin)
    derived = apply_overrides(tree, list(overrides))
    derived["model"] = model  # replaces the T²MLR section whole: a baseline has no recurrence settings
    if model["arch"] != "t2mlr":
        derived["eval"] = {**derived.get("eval", {}), "recurrence": None}
    return Arm(name, label, config_from_tree(derived), **arm)


def _matched_plain(t2mlr: T2MLRConfig, kind: str, recurrent_layers: int) -> PretrainedConfig:
    if kind in RECURRENT_CELLS:
        return matched_recurrent_baseline(t2mlr, kind, recurrent_layers)
    if t2mlr.base_config.model_type == "llama":
        return matched_transformer_config(t2mlr)
    return matched_baseline_config(t2mlr.base_config, t2mlr_parameter_count(t2mlr))


# ---------------------------------------------------------------------------------------------- run directories


def claim_run_dirs(out: str | Path, names: Sequence[str], *, resume: bool, overwrite: bool) -> list[str]:
    """Create OUT and refuse to mix runs: run directories OUT/<name> that already exist need `resume`
    (continue them) or `overwrite` (deleted here). Returns the names that existed."""
    out = Path(out)
    existing = [name for name in names if (out / name).exists()]
    if existing and overwrite:
        for name in existing:
            shutil.rmtree(out / name)
    elif existing and not resume:
        raise FileExistsError(f"{out} already holds runs for {', '.join(existing)}; pass --resume to continue them "
                              "or --overwrite to start again")
    out.mkdir(parents=True, exist_ok=True)
    return existing


def load_trained(arm: TrainedArm) -> tuple[torch.nn.Module, torch.device]:
    """The arm's model rebuilt from its config with its last checkpoint's weights, on the config's device (under
    torchrun: this rank's), in evaluation mode (exactly what was saved)."""
    device = dist_utils.current_env(arm.arm.config.train.device).device
    model = build_model(arm.arm.config.model)
    load_initial_weights(model, arm.checkpoint)
    return model.to(device).eval(), device


def validation_batches(cfg: TrainConfig, max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The fixed validation set of a config: the first `max_batches` (default eval.max_batches) batches of
    eval.batch_size rows of eval.data, as the trainer's periodic evaluation reads them."""
    if cfg.eval.data is None:
        raise ConfigError("the evaluation reads the config's validation data: set an eval.data section")
    count = cfg.eval.max_batches if max_batches is None else max_batches
    if count < 1:
        raise ValueError(f"--eval-batches must be >= 1, got {count}")
    return eval_batches(cfg.eval.data, base_config(cfg.model).vocab_size, cfg.eval.batch_size, count)


# ---------------------------------------------------------------------------------------------- training


def resolve_workers(requested: int | None, runs: int, device: torch.device | str = "cpu") -> int:
    """Worker processes: `requested`, or one per run up to torch's CPU threads on a CPU; 1 on a GPU and
    under torchrun (where every rank trains each arm in turn: more is refused)."""
    if requested is not None and requested < 1:
        raise ValueError(f"workers must be >= 1, got {requested}")
    if dist_utils.launched_by_torchrun():
        if requested is not None and requested > 1:
            raise ValueError(f"--workers {requested} under torchrun: the arms train in turn, each over every rank")
        return 1
    if requested is not None:
        return min(requested, max(1, runs))
    if resolve_device(device).type != "cpu":
        return 1
    return max(1, min(runs, torch.get_num_threads()))


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` for the duration, then restored (None: left as it is)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"torch threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def train_arms(arms: Sequence[Arm], out: str | Path, resume: bool = False, workers: int = 1,
               keep_going: bool = False) -> tuple[dict[str, TrainedArm], dict[str, str]]:
    """Train every arm into OUT/<dir_name>, `workers` at a time; returns the finished arms by name and, with
    `keep_going`, the message of each arm that stopped on a non-finite loss (without it, the first failure is
    raised once the runs under way have finished). A finished arm is left as it is on `resume`."""
    out = Path(out)
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names) or len({arm.dir_name for arm in arms}) != len(arms):
        raise ValueError(f"arm names and directories must differ, got {names}")
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(_labelled(arm, line if workers > 1 and len(arms) > 1 else None), out / arm.dir_name)
            for line, arm in enumerate(arms)]
    outcomes: dict[str, TrainedArm | NonFiniteLossError] = {}
    if workers <= 1 or len(arms) <= 1:
        for index, (arm, run_dir) in enumerate(jobs, 1):
            tqdm.write(f"[arms] {index}/{len(arms)}: {arm.label} → {run_dir}")
            outcomes[arm.name] = _outcome(lambda arm=arm, run_dir=run_dir: _train_one(arm, run_dir, resume), keep_going)
    else:
        with _worker_pool(workers) as pool:
            futures: dict[str, Future[TrainedArm]] = {arm.name: pool.submit(_train_one, arm, run_dir, resume)
                                                      for arm, run_dir in jobs}
            for name, future in futures.items():
                outcomes[name] = _outcome(future.result, keep_going)
    trained = {name: got for name, got in outcomes.items() if isinstance(got, TrainedArm)}
    failed = {name: str(got) for name, got in outcomes.items() if isinstance(got, NonFiniteLossError)}
    return trained, failed


def _outcome(call: Any, keep_going: bool) -> TrainedArm | NonFiniteLossError:
    try:
        return call()
    except NonFiniteLossError as err:
        if not keep_going:
            raise
        return err


def _labelled(arm: Arm, line: int | None) -> Arm:
    """The arm with its progress bar named after it, on its own terminal line when several share one."""
    logging = replace(arm.config.logging, progress_label=arm.config.logging.progress_label or arm.name,
                      progress_line=line)
    return replace(arm, config=replace(arm.config, logging=logging))


def _train_one(arm: Arm, run_dir: Path, resume: bool) -> TrainedArm:
    """Run the trainer on one arm in this process, on the arm's torch threads. Under torchrun every rank trains
    it, and every rank reports rank 0's training time."""
    with fixed_threads(arm.threads):
        result = train(arm.config, run_dir, resume=resume)
    if result.last_checkpoint is None:
        raise RuntimeError(f"training in {run_dir} ended without a checkpoint to evaluate")
    seconds = dist_utils.computed_by_main(lambda: result.step_seconds, dist_utils.current_env())
    return TrainedArm(arm, run_dir, Path(result.last_checkpoint), seconds)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """End this process at once when the process `parent_pid` that started it is gone (Linux: the kernel
    sends SIGKILL; elsewhere a daemon thread polls `os.getppid()`); a parent that died before this call took
    effect is caught by the pid check at the end."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    else:
        threading.Thread(target=exit_when_orphaned, args=(parent_pid,), daemon=True, name="die-with-parent").start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _init_worker(threads: int, bar_lock: Any, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)  # for arms without their own thread count
    tqdm.set_lock(bar_lock)  # the bars of all workers share one terminal


@contextlib.contextmanager
def _worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    context = multiprocessing.get_context("spawn")  # no forked copies of the parent's torch threads or state
    # The pool starts its workers from this thread (on submit) and this thread waits for them, which is what
    # the parent-death signal follows: it fires when the thread that started the process ends.
    threads = max(1, torch.get_num_threads() // workers)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                               initargs=(threads, context.RLock(), os.getpid()))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
