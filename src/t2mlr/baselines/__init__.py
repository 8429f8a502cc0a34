"""Parameter-matched baselines that T²MLR is compared against (docs/semantics.md §8).

* `MatchedLlamaForCausalLM`: the T²MLR backbone widened until it has at least T²MLR's parameters.
* `T2MLRLSTMForCausalLM`: a 4-layer LSTM language model (the S5-Retrieval baseline), matched the same way.
* `matching`: every parameter count and width search (`matched_models(t2mlr_config)` gives both
  baseline configs and all three counts).

Importing this package registers the model types with `AutoConfig` and `AutoModelForCausalLM`, so
saved baselines load with `AutoModelForCausalLM.from_pretrained(dir)` and the trainer can build them
from a config dict (`model_type: t2mlr_lstm` / `t2mlr_matched_llama`).
"""

from transformers import AutoConfig, AutoModelForCausalLM

from t2mlr.baselines import matching
from t2mlr.baselines.lstm import T2MLRLSTMConfig, T2MLRLSTMForCausalLM
from t2mlr.baselines.matching import *  # noqa: F403  (the names listed in matching.__all__)
from t2mlr.baselines.transformer import MatchedLlamaConfig, MatchedLlamaForCausalLM, matched_llama_config

AutoConfig.register(T2MLRLSTMConfig.model_type, T2MLRLSTMConfig, exist_ok=True)
AutoModelForCausalLM.register(T2MLRLSTMConfig, T2MLRLSTMForCausalLM, exist_ok=True)
AutoConfig.register(MatchedLlamaConfig.model_type, MatchedLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(MatchedLlamaConfig, MatchedLlamaForCausalLM, exist_ok=True)

__all__ = [
    "MatchedLlamaConfig",
    "MatchedLlamaForCausalLM",
    "T2MLRLSTMConfig",
    "T2MLRLSTMForCausalLM",
    "matched_llama_config",
    *matching.__all__,
]
