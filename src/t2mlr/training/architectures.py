"""The model architectures a training config can name (`model.arch`), each with its own typed settings.

An architecture's settings are the fields its config class defines, read from that class's
signature: for `t2mlr`, every `T2MLRConfig` recurrence field (l_start, l_end, d_forward, ...). The
trainer's YAML `model:` section is checked against them key by key, so the config class is the only
place a setting is declared. `transformer` is the plain base model, with no settings of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

import t2mlr.baselines  # noqa: F401  (registers the baseline model types, so any trainer process can build them)
from t2mlr.model import T2MLRConfig, T2MLRForCausalLM
from t2mlr.utils import Field


@dataclass(frozen=True)
class Architecture:
    """One `model.arch`: its typed settings, how to check them against a base config, how to build it."""

    name: str
    description: str
    settings: Callable[[], dict[str, Field]]
    check: Callable[[PretrainedConfig, dict[str, Any]], None]
    build: Callable[[PretrainedConfig | None, str | None, dict[str, Any]], nn.Module]
    recurrent: bool = False  # takes the T²MLR forward-path arguments (recurrence, d_forward, ...)


def _no_settings() -> dict[str, Field]:
    return {}


def _check_nothing(base_config: PretrainedConfig, settings: dict[str, Any]) -> None:
    del base_config, settings


def _build_plain(base_config: PretrainedConfig | None, pretrained: str | None, settings: dict[str, Any]) -> nn.Module:
    del settings
    if pretrained is not None:
        return AutoModelForCausalLM.from_pretrained(pretrained)
    return AutoModelForCausalLM.from_config(base_config)


def _check_t2mlr(base_config: PretrainedConfig, settings: dict[str, Any]) -> None:
    T2MLRConfig(base_config=base_config, **settings)  # validates every field against the base model


def _build_t2mlr(base_config: PretrainedConfig | None, pretrained: str | None, settings: dict[str, Any]) -> nn.Module:
    settings = dict(settings)
    l_start, l_end = settings.pop("l_start"), settings.pop("l_end")
    if pretrained is not None:
        return T2MLRForCausalLM.from_base(pretrained, l_start, l_end, **settings)
    return T2MLRForCausalLM(T2MLRConfig.from_base(base_config, l_start, l_end, **settings))


ARCHITECTURES: dict[str, Architecture] = {
    "t2mlr": Architecture(
        "t2mlr", "T²MLR around the base decoder (settings: the T2MLRConfig fields)",
        T2MLRConfig.recurrence_fields, _check_t2mlr, _build_t2mlr, recurrent=True,
    ),
    "transformer": Architecture(
        "transformer", "the base model itself (no settings; the LSTM and matched baselines are base configs)",
        _no_settings, _check_nothing, _build_plain,
    ),
}


def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model.arch {name!r}; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]
