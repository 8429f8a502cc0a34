"""vLLM's entry point into this library (`vllm.general_plugins` in pyproject.toml).

vLLM calls `register()` in every process it starts (the API server, the engine core, the workers)
before it reads a model's config, so `vllm serve DIR` and `LLM(DIR)` find the `t2mlr` model type and
the `T2MLRForCausalLM` architecture without `trust_remote_code` and without importing t2mlr first.
"""

from __future__ import annotations

from .checks import ARCHITECTURE

MODEL_CLASS = "t2mlr.serving.vllm_model:T2MLRVllmForCausalLM"


def register() -> None:
    """Register T²MLR's config with transformers and its model with vLLM (safe to call twice)."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from t2mlr.model.configuration import T2MLRConfig

    from .state import register_state_backend

    AutoConfig.register(T2MLRConfig.model_type, T2MLRConfig, exist_ok=True)  # vLLM reads config.json with it
    register_state_backend()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
