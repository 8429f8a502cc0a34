"""AdamW parameter groups and the learning-rate schedule.

Weight decay pulls parameters towards 0. For the fusion gates γ_cur, γ_rec that would bias the
model back towards "no recurrence" regardless of the data, and for norm gains and biases it is the
usual mistake; so none of them decay (docs/semantics.md §2). Fusion parameters can get their own learning-rate
multiplier because a retrofitted model's fusion module starts from scratch next to trained weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from t2mlr.training.config import OptimConfig, ScheduleConfig

GATE_SUFFIXES = ("gamma_cur", "gamma_rec")
FUSION_PREFIX = "fusion."


def is_no_decay(name: str, param: torch.Tensor) -> bool:
    """γ's, biases, norm gains (every tensor with fewer than 2 dims) and anything named *norm*."""
    return param.ndim < 2 or name.endswith(GATE_SUFFIXES) or "norm" in name.lower()


def is_fusion(name: str) -> bool:
    return name.startswith(FUSION_PREFIX) or f".{FUSION_PREFIX}" in name


def param_groups(named_params: Iterable[tuple[str, nn.Parameter]], cfg: OptimConfig) -> list[dict]:
    """Up to four groups: (decay | no decay) × (base lr | fusion lr). Each carries its `names`."""
    groups: dict[tuple[bool, bool], dict] = {}
    for name, param in named_params:
        if not param.requires_grad:
            continue
        key = (is_no_decay(name, param), is_fusion(name))
        group = groups.setdefault(key, {
            "params": [], "names": [],
            "weight_decay": 0.0 if key[0] else cfg.weight_decay,
            "lr": cfg.lr * (cfg.fusion_lr_mult if key[1] else 1.0),
        })
        group["params"].append(param)
        group["names"].append(name)
    return [groups[key] for key in sorted(groups)]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters (call after FSDP sharding: params must be final)."""
    groups = param_groups(model.named_parameters(), cfg)
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=None)


def lr_multiplier(step: int, cfg: ScheduleConfig, total_steps: int) -> float:
    """LR factor for optimizer step `step` (0-based): linear warmup to 1, then decay to min_lr_ratio.

    Warmup uses (step + 1) / warmup so the first update is not wasted at lr 0.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.kind == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int):
    """A LambdaLR over `lr_multiplier`; each group's own lr (fusion multiplier included) is scaled."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg, total_steps))
