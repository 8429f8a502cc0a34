"""Run directories of experiments and analyses that train several models side by side or in turn.

What every caller that trains arms into OUT/<name> needs, in one place: the trainer's `model.base`
section of a config object, refusing to mix a new run with an old one unless asked, and the training
time summed over resumed attempts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import PretrainedConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from t2mlr.baselines.matching import ModelSpec
    from t2mlr.training.config import TrainConfig

__all__ = ["TIME_FILE", "accumulated_train_seconds", "arm_model_section", "base_section", "claim_run_dirs", "load_trained"]

TIME_FILE = "train_time.json"  # training seconds summed over resumed attempts
_NOT_BASE_KEYS = {"transformers_version", "architectures", "_name_or_path", "dtype"}


def base_section(config: PretrainedConfig) -> dict[str, Any]:
    """The trainer's `model.base` dict that rebuilds `config`: its non-default fields and its model type
    (bookkeeping fields that transformers adds on save are left out)."""
    fields = {k: v for k, v in config.to_diff_dict().items() if k not in _NOT_BASE_KEYS}
    fields["model_type"] = config.model_type
    return fields


def arm_model_section(spec: ModelSpec, config: PretrainedConfig, t2mlr_settings: dict[str, Any]) -> dict[str, Any]:
    """The trainer's `model:` section that builds a comparison arm's config from scratch (`config`: the arm
    as `t2mlr.baselines.matching.matched_arms` built it); T²MLR arms add the experiment's
    `t2mlr_settings` (depths, training and evaluation paths)."""
    if spec.kind == "t2mlr":
        return {"arch": "t2mlr", "base": base_section(config.base_config), "l_start": config.l_start,
                "l_end": config.l_end, **t2mlr_settings}
    if spec.kind == "transformer":
        return {"arch": "transformer", "base": base_section(config)}
    settings = {name: getattr(config, name) for name in type(config).settings_fields()}
    return {"arch": spec.kind, "base": base_section(config.base_config), **settings}


def claim_run_dirs(out: str | Path, names: Sequence[str], *, resume: bool, overwrite: bool) -> list[str]:
    """Create OUT and refuse to mix runs: run directories OUT/<name> that already exist need `resume`
    (continue them) or `overwrite` (deleted here). Returns the names that existed."""
    out = Path(out)
    existing = [name for name in names if (out / name).exists()]
    if existing and overwrite:
        for name in existing:
            shutil.rmtree(out / name)
    elif existing and not resume:
        raise FileExistsError(
            f"{out} already holds runs for {', '.join(existing)}; pass --resume to continue them "
            "or --overwrite to start again"
        )
    out.mkdir(parents=True, exist_ok=True)
    return existing


def accumulated_train_seconds(run_dir: str | Path, spent: float) -> float:
    """Add `spent` seconds to the run's recorded training time and return the total (a resumed run
    reports the time of all its attempts)."""
    path = Path(run_dir) / TIME_FILE
    total = spent + (json.loads(path.read_text(encoding="utf-8"))["seconds"] if path.is_file() else 0.0)
    path.write_text(json.dumps({"seconds": total}) + "\n", encoding="utf-8")
    return total


def load_trained(cfg: TrainConfig, checkpoint: str | Path) -> tuple[nn.Module, torch.device]:
    """The model of `cfg` rebuilt with a run's saved weights, on the config's device (so evaluation sees
    exactly what was saved)."""
    from t2mlr.training.model_factory import build_model, load_initial_weights
    from t2mlr.utils import resolve_device

    device = resolve_device(cfg.train.device)
    model = build_model(cfg.model)
    load_initial_weights(model, Path(checkpoint))
    return model.to(device), device
