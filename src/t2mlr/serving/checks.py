"""What a served T²MLR model refuses, each with a message that names the cause and the way out."""

from __future__ import annotations

from typing import Any

from t2mlr.settings import SUPPORTED_MODEL_TYPES

ARCHITECTURE = "T2MLRForCausalLM"


class NotT2MLRCheckpointError(ValueError):
    """The model directory does not hold a T²MLR checkpoint."""


def t2mlr_config(config: Any) -> Any:
    """The config if it is a T²MLR config around a supported backbone, else a clear error."""
    model_type = getattr(config, "model_type", None)
    if model_type != "t2mlr":
        raise NotT2MLRCheckpointError(
            f"not a T²MLR checkpoint: its config.json has model_type {model_type!r}, not 't2mlr'. Serve a plain "
            "model with `vllm serve` directly; a T²MLR model is saved by T2MLRForCausalLM.save_pretrained "
            "(or `t2mlr retrofit`)")
    base = getattr(config, "base_config", None)
    if base is None:
        raise NotT2MLRCheckpointError("not a usable T²MLR checkpoint: its config has no base_config")
    if base.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"T²MLR serving cannot run a {base.model_type!r} backbone; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return config


def check_engine_settings(vllm_config: Any) -> None:
    """Engine features that would get R wrong are refused, never silently switched off."""
    if vllm_config.speculative_config is not None:
        raise ValueError("T²MLR serving does not support speculative decoding (R would have to be rolled back "
                         "with rejected draft tokens); start vLLM without --speculative-config")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError("T²MLR serving does not support pipeline parallelism (the middle block's state "
                         "cannot span stages); use tensor parallelism or one device")
