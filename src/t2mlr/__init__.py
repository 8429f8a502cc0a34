"""t2mlr: Transformer with Temporal Middle-Layer Recurrence on Hugging Face decoders.

Importing the package registers the `t2mlr` model type with `AutoConfig` and
`AutoModelForCausalLM`, so `AutoModelForCausalLM.from_pretrained(dir)` loads saved T²MLR models.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .model import T2MLRCache, T2MLRCausalLMOutput, T2MLRConfig, T2MLRForCausalLM

AutoConfig.register(T2MLRConfig.model_type, T2MLRConfig, exist_ok=True)
AutoModelForCausalLM.register(T2MLRConfig, T2MLRForCausalLM, exist_ok=True)

__version__ = "0.1.0"
__all__ = ["T2MLRCache", "T2MLRCausalLMOutput", "T2MLRConfig", "T2MLRForCausalLM", "__version__"]
