"""Parameter matching of the looped and pause-token baselines to a T²MLR model.

Same rule as the matched Transformer (`t2mlr.baselines.matching.matched_transformer_config`): the T²MLR
backbone with its hidden size raised, head dimension, head count, depth and MLP size kept, at the
smallest hidden size whose baseline has at least T²MLR's parameter count. Counts come from building the
real modules on the meta device (no weights allocated).

* Looped: looping shares weights, so the count is the widened backbone's, whatever the loop range.
* Pause: the widened backbone plus the `pauses` pause embeddings (pauses × hidden).

At the SmolLM2-135M shape with T²MLR(13, 18) every baseline lands at hidden 584, within 1% above
T²MLR's count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PretrainedConfig

from t2mlr.baselines.looped import LoopedConfig, LoopedForCausalLM
from t2mlr.baselines.matching import count_parameters, smallest_at_least, t2mlr_parameter_count
from t2mlr.baselines.pause import PauseConfig, PauseForCausalLM
from t2mlr.baselines.transformer import matched_llama_config

__all__ = [
    "PAPER_MIDDLE_LOOP",
    "looped_parameter_count",
    "matched_looped_config",
    "matched_pause_config",
    "paper_looped_and_pause_configs",
    "pause_parameter_count",
]

PAPER_MIDDLE_LOOP = (9, 22)  # the paper's middle-looped ×3 on the 30-block SmolLM2-135M


def looped_parameter_count(config: LoopedConfig) -> int:
    with torch.device("meta"):
        return count_parameters(LoopedForCausalLM(config))


def pause_parameter_count(config: PauseConfig) -> int:
    with torch.device("meta"):
        return count_parameters(PauseForCausalLM(config))


def _smallest_matching(
    t2mlr_config: PretrainedConfig,
    wrap: Callable[[PretrainedConfig], PretrainedConfig],
    count: Callable[[PretrainedConfig], int],
) -> PretrainedConfig:
    """`wrap(widened backbone)` at the smallest hidden size (≥ the backbone's) whose count reaches T²MLR's."""
    base = t2mlr_config.base_config
    target = t2mlr_parameter_count(t2mlr_config)

    def build(hidden: int) -> PretrainedConfig:
        return wrap(matched_llama_config(base, hidden))

    return build(smallest_at_least(lambda hidden: count(build(hidden)), target, start=int(base.hidden_size)))


def matched_looped_config(t2mlr_config: PretrainedConfig, loop_start: int, loop_end: int, loops: int) -> LoopedConfig:
    """The looped baseline (blocks loop_start..loop_end, 1-based inclusive, run `loops` times) on the T²MLR
    backbone widened to match T²MLR's parameter count."""
    # bad loop fields fail here, before the width search
    LoopedConfig.from_base(t2mlr_config.base_config, loop_start, loop_end, loops)
    return _smallest_matching(
        t2mlr_config, lambda base: LoopedConfig.from_base(base, loop_start, loop_end, loops), looped_parameter_count
    )


def matched_pause_config(t2mlr_config: PretrainedConfig, pauses: int) -> PauseConfig:
    """The pause-token baseline (`pauses` pauses after every token) on the T²MLR backbone widened to match
    T²MLR's parameter count (the pause embeddings included)."""
    PauseConfig.from_base(t2mlr_config.base_config, pauses)  # bad pause fields fail before the width search
    return _smallest_matching(t2mlr_config, lambda base: PauseConfig.from_base(base, pauses), pause_parameter_count)


def paper_looped_and_pause_configs(t2mlr_config: PretrainedConfig) -> dict[str, PretrainedConfig]:
    """The three baselines of the paper's looped/latent comparison, each matched to `t2mlr_config`:
    pause-token ×2, full-looped ×2 and middle-looped ×3 over blocks 9–22 (needs at least 22 blocks)."""
    depth = int(t2mlr_config.base_config.num_hidden_layers)
    start, end = PAPER_MIDDLE_LOOP
    if depth < end:
        raise ValueError(f"the paper's middle loop covers blocks {start}-{end}; this backbone has only {depth} blocks")
    return {
        "pause_x2": matched_pause_config(t2mlr_config, pauses=1),
        "full_looped_x2": matched_looped_config(t2mlr_config, 1, depth, loops=2),
        "middle_looped_x3": matched_looped_config(t2mlr_config, start, end, loops=3),
    }
