"""The parameter-matched plain Transformer that T²MLR is compared against (SPEC §8).

The paper matches parameters by widening the base model's hidden size until its parameter count is at
least T²MLR's, keeping the depth, the head layout and the head dimension: SmolLM2-135M (hidden 576,
9 heads of 64) becomes hidden 584 with still 9 heads of 64. 584 is not a multiple of 64, so the head
dimension must be set explicitly (`config.head_dim`); the attention projections then map 584 → 9·64.

Parameters are counted by building the model on the meta device, so every family-specific detail
(tied embeddings, q/k norms, projection biases) is counted by transformers itself and no weights are
allocated.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

MAX_WIDENING = 4096  # hidden units searched above the base width before giving up


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding/LM-head matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def head_dim_of(config: PretrainedConfig) -> int:
    """The config's explicit head dimension, else hidden_size / num_attention_heads."""
    explicit = getattr(config, "head_dim", None)
    if explicit is not None:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


def widened_config(base_config: PretrainedConfig, hidden_size: int) -> PretrainedConfig:
    """A copy of `base_config` with `hidden_size` changed and the head count and head dimension kept."""
    config = copy.deepcopy(base_config)
    config.head_dim = head_dim_of(base_config)
    config.hidden_size = hidden_size
    return config


def parameter_count_of_config(config: PretrainedConfig) -> int:
    """Parameters of the causal LM that `config` describes, counted without allocating weights."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return count_parameters(model)


def matched_hidden_size(base_config: PretrainedConfig, t2mlr_param_count: int) -> int:
    """Smallest hidden size (searched upward in steps of 1 from the base width) whose widened base model
    has at least `t2mlr_param_count` parameters, with depth, head count and head dimension unchanged.

    SmolLM2-135M with any T²MLR placement gives 584 (T²MLR adds 5d² + 3d + 2 parameters whatever the
    placement). The intermediate (MLP) size is kept, as in the paper.
    """
    start = int(base_config.hidden_size)
    for hidden_size in range(start, start + MAX_WIDENING + 1):
        if parameter_count_of_config(widened_config(base_config, hidden_size)) >= t2mlr_param_count:
            return hidden_size
    raise ValueError(
        f"no hidden size in [{start}, {start + MAX_WIDENING}] reaches {t2mlr_param_count} parameters; "
        "is the parameter count of the T²MLR model (not of something larger)?"
    )


def matched_baseline_config(base_config: PretrainedConfig, t2mlr_param_count: int) -> PretrainedConfig:
    """The base config widened to the matched hidden size (see `matched_hidden_size`)."""
    return widened_config(base_config, matched_hidden_size(base_config, t2mlr_param_count))
