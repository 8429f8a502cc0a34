"""Build the model a `ModelConfig` describes, and the few facts about it the trainer needs.

The forward path is not decided here: a T²MLR model resolves it itself from its config (the
`train_recurrence` / `eval_recurrence` fields and the Jacobi settings), and the trainer passes only
what the run overrides (`eval.recurrence`) and logs the path the model reports. The looped and
pause-token baselines have one path; the log names their loop or pause layout instead.

Blocks that run several times per step (T²MLR's middle block, a looped model's looped blocks) are the
ones `repeated_block_indices` names: activation checkpointing applies to them, and FSDP2 keeps them
gathered between their runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from torch import nn
from transformers import PretrainedConfig

from t2mlr.baselines import LoopedForCausalLM
from t2mlr.model import is_t2mlr
from t2mlr.model.configuration import build_base_config
from t2mlr.model.pretrained import load_pretrained_base, load_pretrained_config
from t2mlr.training.architectures import get_architecture
from t2mlr.training.checkpoint import MODEL_FILE, load_weights
from t2mlr.training.config import ModelConfig

log = logging.getLogger(__name__)

RECURRENCE_ONLY_INPUTS = ("recurrence_mask", "document_ids")  # batch keys only a T²MLR forward takes
# A plain model's training and evaluation forward: transformers keeps a packed row's documents apart (from
# position_ids restarting at 0) only when no cache is passed or created, and its default use_cache=True creates one.
PLAIN_FORWARD = {"use_cache": False}


def base_config(cfg: ModelConfig) -> PretrainedConfig:
    """The wrapped decoder's config: from the `base` dict, or the pretrained model's own config (a GGUF's
    metadata: no weights are read)."""
    if cfg.base is not None:
        return build_base_config(cfg.base)
    return load_pretrained_config(cfg.pretrained, cfg.gguf_file)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A fresh (or retrofitted) model in float32 on the CPU; the trainer moves and wraps it. A pretrained
    model is loaded once (GGUF weights dequantised) and wrapped without a copy."""
    arch = get_architecture(cfg.arch)
    if cfg.pretrained is not None:
        pretrained, _ = load_pretrained_base(cfg.pretrained, gguf_file=cfg.gguf_file, with_tokenizer=False)
        model = arch.build(None, pretrained.train(), cfg.settings)
    else:
        model = arch.build(base_config(cfg), None, cfg.settings)
    if cfg.init_from:
        load_initial_weights(model, Path(cfg.init_from))
    if cfg.activation_checkpointing:
        if arch.enable_checkpointing is None:  # the config check refuses this first; kept for direct callers
            raise ValueError(f"model.activation_checkpointing does not apply to model.arch {cfg.arch!r}")
        arch.enable_checkpointing(model)
    return model


def describe_path(model: nn.Module, training: bool, recurrence: str | None = None) -> str:
    """The forward path the model takes in training or evaluation mode (with an optional override)."""
    if is_t2mlr(model):
        return model.config.forward_path(training, recurrence).describe()
    layout = getattr(model.config, "describe", None)  # the looped and pause-token baselines name theirs
    return "plain (no recurrence)" if layout is None else f"{layout()} (no recurrence)"


def load_initial_weights(model: nn.Module, path: Path) -> None:
    """Initialise from a training checkpoint directory (its model.safetensors) or a safetensors file."""
    file = path / MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"model.init_from: no weights at {file}")
    missing, unexpected = model.load_state_dict(load_weights(file), strict=False)
    if missing or unexpected:
        raise ValueError(f"model.init_from {file}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    log.info("initialised weights from %s", file)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers in order: every model here is a backbone with its blocks plus a head (T²MLR, the
    looped and pause baselines, plain HF models, the LSTM), so they are `model.model.layers`."""
    return list(model.model.layers)


def repeated_block_indices(model: nn.Module) -> set[int]:
    """0-based indices of the blocks that run several times per step: T²MLR's middle block, a looped
    model's looped blocks (empty for any other model)."""
    if is_t2mlr(model):
        return set(model.model.middle_layer_indices())
    if isinstance(model, LoopedForCausalLM) and model.config.loops > 1:
        return set(model.config.looped_indices())
    return set()


def gate_values(model: nn.Module) -> dict[str, nn.Parameter]:
    """The fusion gates by short name (gamma_cur, gamma_rec); empty for a model without them."""
    if not is_t2mlr(model):
        return {}
    return {name: getattr(model.fusion, name) for name in model.fusion.gate_names}
