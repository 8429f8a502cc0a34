"""The T²MLR model, in dependency order: the fusion Φ and cache norm (`fusion`), the recurrent cache
(`cache`), the token layout and masks (`layout`), the input checks (`checks`), the config and the
forward-path decision (`configuration`), generation plumbing (`generation`), what every model over a
Hugging Face decoder's parts shares (`wrapping`; the looped and pause-token baselines use it too) and the model
itself (`modeling`). `shapes` names the published base-model shapes the paper uses.

Importing this package registers the `t2mlr` model type with `AutoConfig` and `AutoModelForCausalLM`,
so `AutoModelForCausalLM.from_pretrained(dir)` loads saved T²MLR models."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .cache import T2MLRCache, T2MLRStaticCache
from .configuration import ForwardPath, T2MLRConfig
from .fusion import CacheNorm, GatedFusion
from .modeling import (
    T2MLRCausalLMOutput,
    T2MLRForCausalLM,
    T2MLRModel,
    T2MLRModelOutput,
    T2MLRPreTrainedModel,
    is_t2mlr,
)

AutoConfig.register(T2MLRConfig.model_type, T2MLRConfig, exist_ok=True)
AutoModel.register(T2MLRConfig, T2MLRModel, exist_ok=True)
AutoModelForCausalLM.register(T2MLRConfig, T2MLRForCausalLM, exist_ok=True)

__all__ = [
    "CacheNorm",
    "ForwardPath",
    "GatedFusion",
    "T2MLRCache",
    "T2MLRCausalLMOutput",
    "T2MLRConfig",
    "T2MLRForCausalLM",
    "T2MLRModel",
    "T2MLRModelOutput",
    "T2MLRPreTrainedModel",
    "T2MLRStaticCache",
    "is_t2mlr",
]
