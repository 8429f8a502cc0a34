"""Parameter-matched baselines that T²MLR is compared against (docs/semantics.md §8).

* `MatchedLlamaForCausalLM`: the T²MLR backbone widened until it has at least T²MLR's parameters.
* `T2MLRLSTMForCausalLM`: a 4-layer LSTM language model (the S5-Retrieval baseline), matched the same way;
  `T2MLRGRUForCausalLM` and `T2MLRRNNForCausalLM` the same with a GRU or a vanilla (tanh) RNN cell.
* `LoopedForCausalLM`: blocks loop_start..loop_end of a decoder run `loops` times per token (full-looped ×2,
  middle-looped ×3 in the paper); `PauseForCausalLM`: `pauses` pause tokens after every real token (the
  paper's pause ×2 is `pauses=1`). Both run a Hugging Face decoder's parts (`decoder_parts`, built on
  `t2mlr.model`), generate through `generate()` and save/load like any causal LM.
* `matching`: every parameter count and width search (`matched_models(t2mlr_config)` gives the
  Transformer, LSTM, GRU and RNN configs and all counts; `matched_looped_config` / `matched_pause_config`;
  `matched_arms` for side-by-side comparisons named as on the command line).
* `costs`: the FLOP model of a decode step and a training step of every arm.

Importing this package registers every baseline model type with `AutoConfig` and `AutoModelForCausalLM`, so
saved baselines load with `AutoModelForCausalLM.from_pretrained(dir)` and the trainer can build them
from a config dict (`model_type: t2mlr_lstm` / `t2mlr_gru` / `t2mlr_rnn` / `t2mlr_matched_llama` / `t2mlr_looped` /
`t2mlr_pause`).
"""

from transformers import AutoConfig, AutoModelForCausalLM

from t2mlr.baselines import matching
from t2mlr.baselines.looped import LoopedCache, LoopedConfig, LoopedForCausalLM, LoopedModel
from t2mlr.baselines.matching import *  # noqa: F403  (the names listed in matching.__all__)
from t2mlr.baselines.pause import PauseCache, PauseConfig, PauseForCausalLM, PauseModel
from t2mlr.baselines.recurrent import (
    RECURRENT_CELLS,
    RecurrentLMConfig,
    RecurrentLMForCausalLM,
    T2MLRGRUConfig,
    T2MLRGRUForCausalLM,
    T2MLRLSTMConfig,
    T2MLRLSTMForCausalLM,
    T2MLRRNNConfig,
    T2MLRRNNForCausalLM,
)
from t2mlr.baselines.transformer import (
    MatchedLlamaConfig,
    MatchedLlamaForCausalLM,
    matched_llama_config,
)

for _config, _model in (
    (T2MLRLSTMConfig, T2MLRLSTMForCausalLM),
    (T2MLRGRUConfig, T2MLRGRUForCausalLM),
    (T2MLRRNNConfig, T2MLRRNNForCausalLM),
    (MatchedLlamaConfig, MatchedLlamaForCausalLM),
    (LoopedConfig, LoopedForCausalLM),
    (PauseConfig, PauseForCausalLM),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = [
    "LoopedCache",
    "LoopedConfig",
    "LoopedForCausalLM",
    "LoopedModel",
    "MatchedLlamaConfig",
    "MatchedLlamaForCausalLM",
    "PauseCache",
    "PauseConfig",
    "PauseForCausalLM",
    "PauseModel",
    "RECURRENT_CELLS",
    "RecurrentLMConfig",
    "RecurrentLMForCausalLM",
    "T2MLRGRUConfig",
    "T2MLRGRUForCausalLM",
    "T2MLRLSTMConfig",
    "T2MLRLSTMForCausalLM",
    "T2MLRRNNConfig",
    "T2MLRRNNForCausalLM",
    "matched_llama_config",
    *matching.__all__,
]
