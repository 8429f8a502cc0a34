"""Training arms for the analyses that train (`jacobi-vs-exact`, `placement`): configs derived from one
training config by dotted overrides, trained by the project trainer, evaluated on the config's
validation data.

Every arm is an ordinary run directory under OUT (config.yaml, metrics.jsonl, checkpoints/step_N,
final/), so it checkpoints and resumes like any `t2mlr train` run: `resume=True` continues each arm from
its newest checkpoint, and an arm that already finished is only re-evaluated.

The plain Transformer arm is the parameter-matched baseline of docs/semantics.md §8: the T²MLR backbone
widened (head count and head dimension kept) to the smallest hidden size whose parameter count reaches
T²MLR's (`t2mlr.baselines.matching`), trained from scratch on the same data with the same optimiser,
schedule and steps. A config that retrofits a pretrained model (`model.pretrained`) has no widened twin
with pretrained weights; its Transformer arm is the pretrained base model itself, fine-tuned the same
way (the label says so).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from t2mlr.analysis.common import load_analysis_model
from t2mlr.baselines.matching import (
    matched_baseline_config,
    matched_transformer_config,
    t2mlr_parameter_count,
)
from t2mlr.model import T2MLRConfig
from t2mlr.model.configuration import build_base_config
from t2mlr.training.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_tree,
    deep_merge,
    load_yaml_tree,
    resolve_config_path,
)
from t2mlr.training.data import Collator, build_dataset, eval_batches, labels_aligned
from t2mlr.training.model_factory import base_config
from t2mlr.training.runs import accumulated_train_seconds, base_section
from t2mlr.training.trainer import FINAL_DIR, train
from t2mlr.utils import resolve_device

__all__ = [
    "Arm",
    "TrainedArm",
    "arm_from_tree",
    "config_tree",
    "transformer_arm",
    "train_arms",
    "validation_batches",
]



@dataclass(frozen=True)
class Arm:
    """One run to train: its directory name under OUT, its label in tables, its full trainer config."""

    name: str
    label: str
    config: TrainConfig


@dataclass(frozen=True)
class TrainedArm:
    arm: Arm
    run_dir: Path
    model_dir: Path
    seconds: float


def config_tree(config: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The plain tree of a YAML config or preset with the user's overrides applied (checked by building
    it once); the arms add their own overrides on top."""
    tree = apply_overrides(load_yaml_tree(resolve_config_path(config)), list(overrides))
    cfg = config_from_tree(tree)
    if cfg.model.arch != "t2mlr":
        raise ConfigError(f"{config}: model.arch is {cfg.model.arch!r}; the analysis trains T²MLR arms from a "
                          "T²MLR config (model.arch: t2mlr)")
    return tree


def arm_from_tree(tree: dict[str, Any], name: str, label: str, overrides: Sequence[str] = ()) -> Arm:
    """An arm whose config is `tree` with `overrides` (dotted key=value) applied; its progress bar is
    labelled with the arm's name."""
    derived = apply_overrides(tree, [*overrides, f"logging.progress_label={name}"])
    return Arm(name, label, config_from_tree(derived))


def matched_base_section(cfg: TrainConfig) -> tuple[dict[str, Any], int, int]:
    """The widened base config of the parameter-matched Transformer (as a `model.base` dict), its
    hidden size and T²MLR's parameter count."""
    base = build_base_config(cfg.model.base)
    t2mlr = T2MLRConfig(base_config=base, **cfg.model.settings)
    if base.model_type == "llama":
        matched = matched_transformer_config(t2mlr)
    else:
        matched = matched_baseline_config(base, t2mlr_parameter_count(t2mlr))
    return base_section(matched), int(matched.hidden_size), t2mlr_parameter_count(t2mlr)


def transformer_arm(tree: dict[str, Any], name: str = "transformer") -> Arm:
    """The plain Transformer arm for a T²MLR config tree (see the module docstring)."""
    cfg = config_from_tree(tree)
    model = {"arch": "transformer"}
    if cfg.model.pretrained is not None:
        model["pretrained"] = cfg.model.pretrained
        label = "Transformer (the pretrained base, fine-tuned the same way)"
    else:
        section, hidden, _ = matched_base_section(cfg)
        model["base"] = section
        label = f"Transformer (matched, hidden {hidden})"
    derived = deep_merge(tree, {"eval": {"recurrence": None}, "logging": {"progress_label": name}})
    derived["model"] = model  # replaces the T²MLR section whole: the plain model has no recurrence settings
    return Arm(name, label, config_from_tree(derived))


def train_arms(arms: Sequence[Arm], out: str | Path, resume: bool = False) -> list[TrainedArm]:
    """Train the arms one after another into OUT/<arm name> with the project trainer.

    Without `resume` an arm whose run directory already holds checkpoints is refused (the trainer's
    FileExistsError says so); with it, each arm continues from its newest checkpoint and a finished arm
    is left as it is. (On a CPU the arms could train side by side, as the S5 experiment does; that
    scheduler lives in t2mlr.experiments, above this layer, so here they run in turn.)"""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must differ, got {names}")
    trained = []
    for index, arm in enumerate(arms, 1):
        run_dir = out / arm.name
        tqdm.write(f"[analyze] training arm {index}/{len(arms)}: {arm.label} → {run_dir}")
        started = time.perf_counter()
        train(arm.config, run_dir, resume=resume)
        seconds = accumulated_train_seconds(run_dir, time.perf_counter() - started)
        trained.append(TrainedArm(arm, run_dir, run_dir / FINAL_DIR, seconds))
    return trained


def validation_batches(cfg: TrainConfig, max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The fixed validation set of a config: the first `max_batches` (default eval.max_batches) batches of
    eval.batch_size rows of eval.data, as the trainer's periodic evaluation reads them."""
    if cfg.eval.data is None:
        raise ConfigError("the analysis evaluates on the config's validation data: set an eval.data section")
    vocab = base_config(cfg.model).vocab_size
    dataset = build_dataset(cfg.eval.data, vocab_size=vocab, name="eval.data")
    collator = Collator(cfg.eval.data.pad_token_id, labels_aligned(dataset, cfg.eval.data))
    count = cfg.eval.max_batches if max_batches is None else max_batches
    if count < 1:
        raise ValueError(f"--eval-batches must be >= 1, got {count}")
    return eval_batches(dataset, collator, cfg.eval.batch_size, count)


def load_trained(arm: TrainedArm) -> nn.Module:
    """The arm's finished model (its final/ directory) on the arm's device, in float32."""
    return load_analysis_model(arm.model_dir, device=str(resolve_device(arm.arm.config.train.device)))
