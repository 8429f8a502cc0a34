"""The parameter-matched Transformer baseline: the T²MLR backbone, widened (docs/semantics.md §8).

The paper widens the hidden size until the plain model has at least as many parameters as T²MLR,
keeping depth, head count and head dimension: SmolLM2-135M (576 = 9 heads × 64) becomes 584 with
still 9 heads of 64, so the attention projections map 584 → 576 and back. Llama's modelling code
supports that (it sizes the projections from `head_dim`), but transformers' `LlamaConfig` refuses a
hidden size that is not a multiple of the head count, at construction and again in
`save_pretrained`. `MatchedLlamaConfig` is `LlamaConfig` with that one check replaced by the rule the
matching needs (an explicit, positive `head_dim`), under its own model type so saved baselines load
back through `AutoModelForCausalLM` (the registration is in `t2mlr.baselines`).
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig

__all__ = ["MatchedLlamaConfig", "MatchedLlamaForCausalLM", "matched_llama_config"]


@strict
class MatchedLlamaConfig(LlamaConfig):
    """`LlamaConfig` whose hidden size need not be a multiple of the head count (see module docstring)."""

    model_type = "t2mlr_matched_llama"

    def validate_architecture(self) -> None:
        """Widening keeps `head_dim` fixed, so it must be given explicitly instead of derived."""
        if self.head_dim is None or self.head_dim < 1:
            raise ValueError(f"MatchedLlamaConfig needs an explicit head_dim >= 1, got {self.head_dim!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )


class MatchedLlamaForCausalLM(LlamaForCausalLM):
    """A plain `LlamaForCausalLM`; only the config class differs (it may be widened past 'heads × head_dim')."""

    config_class = MatchedLlamaConfig


_NOT_COPIED = {"model_type", "architectures", "transformers_version", "_name_or_path", "auto_map", "dtype"}


def matched_llama_config(base_config: PretrainedConfig, hidden_size: int) -> MatchedLlamaConfig:
    """`base_config` (a Llama config) with `hidden_size` replaced and the head layout and head dim kept."""
    if getattr(base_config, "model_type", None) not in ("llama", MatchedLlamaConfig.model_type):
        raise ValueError(
            f"the matched Transformer widens Llama backbones only, got model_type {base_config.model_type!r}"
        )
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
    fields: dict[str, Any] = {k: v for k, v in base_config.to_dict().items() if k not in _NOT_COPIED}
    head_dim = getattr(base_config, "head_dim", None) or base_config.hidden_size // base_config.num_attention_heads
    fields.update(hidden_size=hidden_size, head_dim=head_dim)
    return MatchedLlamaConfig(**fields)
