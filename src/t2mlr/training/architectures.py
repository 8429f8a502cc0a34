"""The model architectures a training config can name (`model.arch`), each with its own typed settings.

An architecture's settings are the fields its config class defines, read from that class's
signature: for `t2mlr`, every `T2MLRConfig` recurrence field (l_start, l_end, d_forward, ...); for
`looped`, the `LoopedConfig` fields (loop_blocks — "full" or "S-E", 1-based inclusive — or
loop_start/loop_end, and loops); for `pause`, the `PauseConfig` fields (pauses: pause tokens after every
real token, so `pauses: 1` is the paper's ×2; pause_token_id). The trainer's YAML `model:` section is
checked against them key by key, so the config class is the only place a setting is declared.
`transformer` is the plain base model, with no settings of its own.

Each architecture also says which of its blocks `model.activation_checkpointing` checkpoints: the
blocks that run several times per step (T²MLR's middle block on the Jacobi path, the looped blocks),
or why it refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from t2mlr.baselines import (  # importing t2mlr.baselines registers every baseline type
    LoopedForCausalLM,
    PauseForCausalLM,
)
from t2mlr.baselines.decoder_parts import (
    WrappedDecoderConfig,
    WrappedDecoderForCausalLM,
)
from t2mlr.model import T2MLRConfig, T2MLRForCausalLM
from t2mlr.utils import Field


@dataclass(frozen=True)
class Architecture:
    """One `model.arch`: its typed settings, how to check them against a base config, how to build it,
    and how `model.activation_checkpointing` applies to it."""

    name: str
    description: str
    settings: Callable[[], dict[str, Field]]
    check: Callable[[PretrainedConfig, dict[str, Any]], None]
    # build(base_config, pretrained_model, settings): a fresh model from the config, or one wrapping (not
    # copying) the loaded pretrained model
    build: Callable[[PretrainedConfig | None, PreTrainedModel | None, dict[str, Any]], nn.Module]
    recurrent: bool = False  # takes the T²MLR forward-path arguments (recurrence, d_forward, ...)
    checkpointing_refusal: Callable[[dict[str, Any]], str | None] = lambda settings: _NO_REPEATED_BLOCKS
    enable_checkpointing: Callable[[nn.Module], None] | None = None


_NO_REPEATED_BLOCKS = "it runs every block once per step (nothing repeats that checkpointing would save)"


def _build_plain(
    base_config: PretrainedConfig | None, pretrained: PreTrainedModel | None, settings: dict[str, Any]
) -> nn.Module:
    del settings
    if pretrained is not None:
        return pretrained
    return AutoModelForCausalLM.from_config(base_config)


def _check_t2mlr(base_config: PretrainedConfig, settings: dict[str, Any]) -> None:
    T2MLRConfig(base_config=base_config, **settings)  # validates every field against the base model


def _build_t2mlr(
    base_config: PretrainedConfig | None, pretrained: PreTrainedModel | None, settings: dict[str, Any]
) -> nn.Module:
    settings = dict(settings)
    l_start, l_end = settings.pop("l_start"), settings.pop("l_end")
    if pretrained is not None:
        return T2MLRForCausalLM.from_base(pretrained, l_start, l_end, **settings)
    return T2MLRForCausalLM(T2MLRConfig.from_base(base_config, l_start, l_end, **settings))


def _t2mlr_checkpointing_refusal(settings: dict[str, Any]) -> str | None:
    if settings.get("train_recurrence") == "exact" and settings.get("bptt_window") is None:
        return ("it checkpoints the T²MLR middle block, which the exact path runs token by token with a KV cache "
                "that a recomputation cannot replay (so nothing would be saved): use train_recurrence=jacobi, or "
                "model.bptt_window, whose replay pass over the whole chunk is checkpointed")
    return None


def _wrapper_architecture(
    name: str, description: str, model_class: type[WrappedDecoderForCausalLM], **extra: Any
) -> Architecture:
    """A baseline that wraps the base decoder: its settings are its config class's fields."""
    config_class: type[WrappedDecoderConfig] = model_class.config_class

    def check(base_config: PretrainedConfig, settings: dict[str, Any]) -> None:
        config_class(base_config=base_config, **settings)  # validates every field against the base model

    def build(
        base_config: PretrainedConfig | None, pretrained: PreTrainedModel | None, settings: dict[str, Any]
    ) -> nn.Module:
        return model_class.wrap(pretrained if pretrained is not None else base_config, **settings)

    return Architecture(name, description, config_class.settings_fields, check, build, **extra)


ARCHITECTURES: dict[str, Architecture] = {
    "t2mlr": Architecture(
        "t2mlr", "T²MLR around the base decoder (settings: the T2MLRConfig fields)",
        T2MLRConfig.recurrence_fields, _check_t2mlr, _build_t2mlr, recurrent=True,
        checkpointing_refusal=_t2mlr_checkpointing_refusal,
        enable_checkpointing=lambda model: model.model.set_middle_checkpointing(True),
    ),
    "looped": _wrapper_architecture(
        "looped", "looped Transformer: blocks loop_blocks ('full' or 'S-E') run `loops` times (LoopedConfig fields)",
        LoopedForCausalLM, checkpointing_refusal=lambda settings: None,
        enable_checkpointing=lambda model: model.model.set_loop_checkpointing(True),
    ),
    "pause": _wrapper_architecture(
        "pause", "pause tokens: `pauses` after every real token, pauses: 1 is ×2 (PauseConfig fields)",
        PauseForCausalLM,
    ),
    "transformer": Architecture(
        "transformer", "the base model itself (no settings; the LSTM and matched baselines are base configs)",
        lambda: {}, lambda base_config, settings: None, _build_plain,
    ),
}

def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model.arch {name!r}; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def checkpointing_refusal(name: str, settings: dict[str, Any]) -> str | None:
    """Why `model.activation_checkpointing` cannot apply to this architecture with these settings (None: it can)."""
    return get_architecture(name).checkpointing_refusal(settings)
