"""Build the model a `ModelConfig` describes and the keyword arguments each forward call gets.

The forward path is resolved here once and passed explicitly on every call, for training and for
evaluation alike, so the log can state it and nothing switches silently (SPEC §9).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

import t2mlr.baselines  # noqa: F401  (registers the baseline model types, so any trainer process can build them)
from t2mlr.training.config import ModelConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardPath:
    """The recurrence settings one kind of forward call (train or eval) uses."""

    recurrence: str  # "jacobi" | "exact" | "off" | "none" (plain transformer baseline)
    d_forward: int | None = None
    d_backward: int | None = None
    jacobi_tol: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """Model keyword arguments; a plain transformer gets none."""
        if self.recurrence == "none":
            return {}
        out: dict[str, Any] = {"recurrence": self.recurrence}
        if self.recurrence == "jacobi":
            out.update(d_forward=self.d_forward, d_backward=self.d_backward, jacobi_tol=self.jacobi_tol)
        return out

    def describe(self) -> str:
        if self.recurrence == "none":
            return "plain transformer (no recurrence module)"
        if self.recurrence == "jacobi":
            return (f"jacobi (d_forward={self.d_forward}, d_backward={self.d_backward}, "
                    f"jacobi_tol={self.jacobi_tol})")
        return self.recurrence


def train_path(cfg: ModelConfig) -> ForwardPath:
    if cfg.arch == "transformer":
        return ForwardPath("none")
    return ForwardPath(cfg.train_recurrence, cfg.d_forward, cfg.d_backward, cfg.jacobi_tol)


def eval_path(cfg: ModelConfig, override: str | None) -> ForwardPath:
    """Evaluation path: `eval.recurrence` when set, else model.eval_recurrence. Jacobi eval never stops early
    unless jacobi_tol is set (the same tolerance as training)."""
    if cfg.arch == "transformer":
        return ForwardPath("none")
    path = override or cfg.eval_recurrence
    return ForwardPath(path, cfg.d_forward, cfg.d_backward, cfg.jacobi_tol)


def base_config(cfg: ModelConfig) -> PretrainedConfig:
    """The wrapped decoder's config: from the `base` dict, or the pretrained model's own config."""
    if cfg.base is not None:
        fields = dict(cfg.base)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    return AutoConfig.from_pretrained(cfg.pretrained)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A fresh (or retrofitted) model in float32 on the CPU; the trainer moves and wraps it."""
    if cfg.arch == "transformer":
        model = _build_transformer(cfg)
    else:
        model = _build_t2mlr(cfg)
    if cfg.init_from:
        load_initial_weights(model, Path(cfg.init_from))
    if cfg.activation_checkpointing:
        enable_middle_checkpointing(model)
    return model


def _build_transformer(cfg: ModelConfig) -> nn.Module:
    if cfg.pretrained:
        return AutoModelForCausalLM.from_pretrained(cfg.pretrained)
    return AutoModelForCausalLM.from_config(base_config(cfg))


def _build_t2mlr(cfg: ModelConfig) -> nn.Module:
    from t2mlr import T2MLRConfig, T2MLRForCausalLM

    kwargs = dict(
        d_forward=cfg.d_forward, d_backward=cfg.d_backward,
        train_recurrence=cfg.train_recurrence, eval_recurrence=cfg.eval_recurrence, **cfg.extra,
    )
    if cfg.pretrained:
        return T2MLRForCausalLM.from_base(cfg.pretrained, cfg.l_start, cfg.l_end, **kwargs)
    t2_config = T2MLRConfig.from_base(base_config(cfg), l_start=cfg.l_start, l_end=cfg.l_end, **kwargs)
    return T2MLRForCausalLM(t2_config)


def load_initial_weights(model: nn.Module, path: Path) -> None:
    """Initialise from a training checkpoint directory (its model.safetensors) or a safetensors file."""
    from t2mlr.training.checkpoint import MODEL_FILE, load_weights

    file = path / MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"model.init_from: no weights at {file}")
    missing, unexpected = model.load_state_dict(load_weights(file), strict=False)
    if missing or unexpected:
        raise ValueError(f"model.init_from {file}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    log.info("initialised weights from %s", file)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers in order (T²MLR: model.base.model.layers; plain HF: model.model.layers)."""
    inner = model.base if hasattr(model, "base") else model
    return list(inner.model.layers)


def middle_indices(model: nn.Module) -> set[int]:
    """0-based indices of the recurrent block (empty for a plain transformer)."""
    if hasattr(model, "middle_layer_indices"):
        return set(model.middle_layer_indices())
    return set()


def enable_middle_checkpointing(model: nn.Module) -> None:
    """Recompute the middle block in backward instead of storing its activations (Jacobi runs it many times)."""
    if not hasattr(model, "set_middle_checkpointing"):
        raise ValueError("model.activation_checkpointing needs a T²MLR model (arch: t2mlr)")
    model.set_middle_checkpointing(True)


def gate_values(model: nn.Module) -> dict[str, nn.Parameter]:
    """The fusion gates by short name (gamma_cur, gamma_rec); empty for a plain transformer."""
    return {name.rsplit(".", 1)[-1]: p for name, p in model.named_parameters()
            if name.endswith(("fusion.gamma_cur", "fusion.gamma_rec"))}
