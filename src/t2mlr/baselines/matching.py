"""Parameter matching: each baseline gets the smallest width whose parameter count is ≥ T²MLR's.

Counts come from building the model on the meta device: every detail (tied embeddings, biases, q/k
norms, the fusion module and the cache norm) is counted by the real module code, and no weights are
allocated, so a 135M-parameter model costs milliseconds.

* Transformer: the T²MLR backbone with its hidden size raised, depth, head count, head dimension and
  MLP (intermediate) size kept, as in the paper (SmolLM2-135M, T²MLR(13,18): 576 → 584, still 9 heads
  of 64, so the attention projections map 584 → 576 and back). `matched_hidden_size` finds the width
  for any decoder family; `matched_transformer_config` gives a savable `MatchedLlamaConfig`.
* LSTM: embedding → `num_layers`-layer LSTM → head, all of one width.

Every search is `smallest_at_least`: doubling for an upper bound, then bisection, O(log w) model builds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from t2mlr.baselines.lstm import T2MLRLSTMConfig, T2MLRLSTMForCausalLM
from t2mlr.baselines.transformer import MatchedLlamaConfig, MatchedLlamaForCausalLM, matched_llama_config
from t2mlr.model import T2MLRConfig, T2MLRForCausalLM

__all__ = [
    "MatchedSet",
    "count_parameters",
    "head_dim_of",
    "lstm_parameter_count",
    "matched_baseline_config",
    "matched_hidden_size",
    "matched_lstm_config",
    "matched_models",
    "matched_transformer_config",
    "parameter_count_of_config",
    "smallest_at_least",
    "t2mlr_parameter_count",
    "transformer_parameter_count",
    "widened_config",
]

MAX_WIDTH = 1 << 20  # a search that passes this width is matching against a wrong count


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding/LM-head matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def _meta_count(build: Callable[[], nn.Module]) -> int:
    with torch.device("meta"):
        return count_parameters(build())


def parameter_count_of_config(config: PretrainedConfig) -> int:
    """Parameters of the causal LM that `config` describes, counted without allocating weights."""
    return _meta_count(lambda: AutoModelForCausalLM.from_config(config))


def head_dim_of(config: PretrainedConfig) -> int:
    """The config's explicit head dimension, else hidden_size / num_attention_heads."""
    explicit = getattr(config, "head_dim", None)
    if explicit is not None:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


def widened_config(base_config: PretrainedConfig, hidden_size: int) -> PretrainedConfig:
    """A copy of `base_config` (any decoder family) with `hidden_size` changed and the head count and
    head dimension kept; for timing and counting (a widened Llama saves as a `MatchedLlamaConfig`)."""
    config = copy.deepcopy(base_config)
    config.head_dim = head_dim_of(base_config)
    config.hidden_size = hidden_size
    return config


def smallest_at_least(count: Callable[[int], int], target: int, start: int = 1) -> int:
    """Smallest integer w ≥ start with count(w) ≥ target, for a count that grows with w.

    Doubling finds an upper bound, bisection the boundary: O(log w) model builds.
    """
    if start < 1:
        raise ValueError(f"start must be >= 1, got {start}")
    if count(start) >= target:
        return start
    low, high = start, 2 * start  # invariant: count(low) < target
    while count(high) < target:
        low, high = high, 2 * high
        if high > MAX_WIDTH:
            raise ValueError(f"no width up to {MAX_WIDTH} reaches {target} parameters")
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) >= target:
            high = middle
        else:
            low = middle
    return high


def matched_hidden_size(base_config: PretrainedConfig, target: int) -> int:
    """Smallest hidden size, from the base width up, whose widened base model has at least `target`
    parameters, with depth, head count, head dimension and MLP size unchanged. SmolLM2-135M with any
    T²MLR placement gives 584 (T²MLR adds 5d² + 3d + 2 parameters whatever the placement)."""
    return smallest_at_least(
        lambda hidden: parameter_count_of_config(widened_config(base_config, hidden)), target,
        start=int(base_config.hidden_size),
    )


def matched_baseline_config(base_config: PretrainedConfig, target: int) -> PretrainedConfig:
    """The base config widened to the matched hidden size (see `matched_hidden_size`)."""
    return widened_config(base_config, matched_hidden_size(base_config, target))


def t2mlr_parameter_count(config: T2MLRConfig) -> int:
    """Parameters of `T2MLRForCausalLM(config)`: the base model plus 5d² + 3d + 2 for Φ and the cache norm."""
    return _meta_count(lambda: T2MLRForCausalLM(config))


def transformer_parameter_count(config: MatchedLlamaConfig) -> int:
    return _meta_count(lambda: MatchedLlamaForCausalLM(config))


def lstm_parameter_count(config: T2MLRLSTMConfig) -> int:
    return _meta_count(lambda: T2MLRLSTMForCausalLM(config))


def matched_transformer_config(t2mlr_config: T2MLRConfig) -> MatchedLlamaConfig:
    """The T²MLR backbone widened to the smallest hidden size with at least T²MLR's parameter count."""
    target = t2mlr_parameter_count(t2mlr_config)
    hidden = matched_hidden_size(t2mlr_config.base_config, target)
    return matched_llama_config(t2mlr_config.base_config, hidden)


def matched_lstm_config(vocab_size: int, target: int, num_layers: int = 4, **config_kwargs: object) -> T2MLRLSTMConfig:
    """The LSTM baseline with the smallest hidden size whose parameter count is at least `target`."""

    def build(hidden: int) -> T2MLRLSTMConfig:
        return T2MLRLSTMConfig(vocab_size=vocab_size, hidden_size=hidden, num_layers=num_layers, **config_kwargs)

    hidden = smallest_at_least(lambda h: lstm_parameter_count(build(h)), target)
    return build(hidden)


@dataclass(frozen=True)
class MatchedSet:
    """A T²MLR config and its two matched baselines, with every parameter count."""

    t2mlr: T2MLRConfig
    transformer: MatchedLlamaConfig
    lstm: T2MLRLSTMConfig
    t2mlr_params: int
    transformer_params: int
    lstm_params: int

    def rows(self) -> list[tuple[str, int, int]]:
        """(model, hidden size, parameters) for printing side by side."""
        return [
            ("T²MLR", self.t2mlr.hidden_size, self.t2mlr_params),
            ("Transformer (matched)", self.transformer.hidden_size, self.transformer_params),
            ("LSTM (matched)", self.lstm.hidden_size, self.lstm_params),
        ]


def matched_models(t2mlr_config: T2MLRConfig, lstm_layers: int = 4) -> MatchedSet:
    """Both baselines for `t2mlr_config`, matched to its parameter count."""
    target = t2mlr_parameter_count(t2mlr_config)
    transformer = matched_transformer_config(t2mlr_config)
    base: PretrainedConfig = t2mlr_config.base_config
    special = {name: getattr(base, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    lstm = matched_lstm_config(int(base.vocab_size), target, num_layers=lstm_layers, **special)
    return MatchedSet(
        t2mlr=t2mlr_config,
        transformer=transformer,
        lstm=lstm,
        t2mlr_params=target,
        transformer_params=transformer_parameter_count(transformer),
        lstm_params=lstm_parameter_count(lstm),
    )
