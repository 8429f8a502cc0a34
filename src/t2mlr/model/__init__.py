"""The T²MLR model: configuration, fusion Φ, recurrent cache and the forward paths."""

from .cache import T2MLRCache
from .configuration import T2MLRConfig
from .fusion import CacheNorm, GatedFusion
from .modeling import T2MLRCausalLMOutput, T2MLRForCausalLM, T2MLRPreTrainedModel

__all__ = [
    "CacheNorm",
    "GatedFusion",
    "T2MLRCache",
    "T2MLRCausalLMOutput",
    "T2MLRConfig",
    "T2MLRForCausalLM",
    "T2MLRPreTrainedModel",
]
