"""Pieces shared by the looped and the pause-token baselines.

Both wrap a Hugging Face `*ForCausalLM` (Llama, Mistral, Qwen2, Qwen3, or the widened Llama of the
matched Transformer) and drive its own embedding, decoder blocks, rotary embedding, attention masks,
final norm and LM head in an order of their own. This module holds what both need: rebuilding a nested
base config, checking the wrapped model, positions of a chunk, and the attention masks per block kind.
Nothing here depends on `t2mlr.model`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from t2mlr.baselines.transformer import MatchedLlamaConfig

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "as_base_config",
    "attention_masks",
    "block_attention_kinds",
    "build_base_model",
    "check_attention_mask",
    "check_no_extra_outputs",
    "check_positive_int",
    "check_supported_base",
    "chunk_position_ids",
    "chunk_shape",
    "inherit_special_tokens",
    "kept_positions",
    "wrap_pretrained",
]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", MatchedLlamaConfig.model_type)
_INHERITED = ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")


def as_base_config(base_config: PretrainedConfig | dict[str, Any] | None) -> PretrainedConfig | None:
    """A serialised base config (a dict with `model_type`, as `save_pretrained` writes it) back as its
    transformers class; a config object or None is returned unchanged."""
    if base_config is None or isinstance(base_config, PretrainedConfig):
        return base_config
    if not isinstance(base_config, dict) or "model_type" not in base_config:
        raise ValueError("base_config must be a transformers PretrainedConfig or a dict with a 'model_type' key")
    fields = dict(base_config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def inherit_special_tokens(base_config: PretrainedConfig | None, kwargs: dict[str, Any]) -> None:
    """Copy the base model's special token ids and embedding tying into the wrapper's config kwargs, so
    `generate()` and weight tying read the same values through either config."""
    if base_config is None:
        return
    for name in _INHERITED:
        kwargs.setdefault(name, getattr(base_config, name, None))


def check_supported_base(base_config: PretrainedConfig, model_name: str) -> None:
    model_type = getattr(base_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"the {model_name} cannot wrap base model type {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def build_base_model(
    base_config: PretrainedConfig, attn_implementation: str | None, model_name: str
) -> PreTrainedModel:
    """A freshly initialised base `*ForCausalLM`, checked to expose the parts the wrapper drives."""
    base = AutoModelForCausalLM.from_config(base_config, attn_implementation=attn_implementation)
    check_wrappable(base, model_name)
    return base


def check_wrappable(base: PreTrainedModel, model_name: str) -> None:
    inner = getattr(base, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, name) for name in needed) or not hasattr(base, "lm_head"):
        raise ValueError(
            f"cannot wrap {type(base).__name__}: the {model_name} needs a *ForCausalLM with .model.embed_tokens, "
            ".model.layers, .model.norm, .model.rotary_emb and .lm_head (Llama, Mistral, Qwen2, Qwen3)"
        )


def wrap_pretrained(
    model_cls: type[PreTrainedModel], config: PretrainedConfig, base: PreTrainedModel
) -> PreTrainedModel:
    """`model_cls(config, base_model=base)` with the base weights exactly as they were: `post_init` may
    re-initialise modules it considers new, so the base state is put back afterwards."""
    check_wrappable(base, model_cls.__name__)
    state = {name: value.detach().clone() for name, value in base.state_dict().items()}
    model = model_cls(config, base_model=base)
    model.base.load_state_dict(state)
    return model


def chunk_shape(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, hidden_size: int, vocab_size: int
) -> tuple[int, int]:
    """Batch and length of the chunk, after checking shapes and that token ids lie in the vocabulary."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[1] == 0 or inputs_embeds.shape[-1] != hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq >= 1, {hidden_size}), got {tuple(inputs_embeds.shape)}"
            )
        return inputs_embeds.shape[0], inputs_embeds.shape[1]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.is_floating_point():
        raise ValueError(
            f"input_ids must be an integer tensor of shape (batch, seq) with seq >= 1, got {input_ids.dtype} "
            f"{tuple(input_ids.shape)}"
        )
    low, high = torch.stack(torch.aminmax(input_ids)).tolist()
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{low}, {high}]")
    return input_ids.shape[0], input_ids.shape[1]


def check_attention_mask(mask: torch.Tensor | None, batch: int, total: int) -> torch.Tensor | None:
    """A 2D padding mask covering the cached tokens and the chunk, or None."""
    if mask is None:
        return None
    if mask.dim() != 2 or tuple(mask.shape) != (batch, total):
        raise ValueError(f"attention_mask must be 2D (batch, past + seq) = ({batch}, {total}), got {tuple(mask.shape)}")
    return mask


def check_no_extra_outputs(kwargs: dict[str, Any]) -> None:
    """These wrappers return logits (and the cache) only; asking for more is refused, not ignored."""
    for name in ("output_attentions", "output_hidden_states"):
        if kwargs.get(name):
            raise ValueError(f"{name}=True is not supported by this baseline")


def chunk_position_ids(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past: int,
    batch: int,
    length: int,
    device: torch.device,
) -> torch.Tensor:
    """Positions of the chunk's tokens: the given ones; else counted over real tokens of the padding
    mask (as `generate()` does, so a left-padded row gets the positions it would have alone); else
    past, past + 1, ...."""
    if position_ids is None:
        if attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
        else:
            position_ids = torch.arange(past, past + length, device=device)[None]
    if position_ids.dim() != 2 or position_ids.shape[-1] != length:
        raise ValueError(f"position_ids must have shape (batch, {length}), got {tuple(position_ids.shape)}")
    return position_ids.to(device).expand(batch, length)


def block_attention_kinds(base_config: PretrainedConfig) -> list[str]:
    """Per block: "full_attention" or "sliding_attention" (Mistral, or Qwen2/3 with windows)."""
    layer_types = getattr(base_config, "layer_types", None)
    if layer_types is not None:
        return list(layer_types)
    kind = "sliding_attention" if getattr(base_config, "sliding_window", None) is not None else "full_attention"
    return [kind] * int(base_config.num_hidden_layers)


def attention_masks(
    base_config: PretrainedConfig,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: Any,
    position_ids: torch.Tensor,
) -> dict[str, Any]:
    """The mask of each attention kind the blocks use, built by transformers' own mask builders (which
    size them from the cache's first layer of that kind)."""
    masks: dict[str, Any] = {}
    for kind in sorted(set(block_attention_kinds(base_config))):
        builder = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
        masks[kind] = builder(
            config=base_config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            past_key_values=cache,
            position_ids=position_ids,
        )
    return masks


def kept_positions(logits_to_keep: int | torch.Tensor) -> slice | torch.Tensor:
    """Which positions get logits: the last `n` (0 = all) or explicit indices, as in transformers."""
    if isinstance(logits_to_keep, int):
        return slice(-logits_to_keep, None)
    return logits_to_keep
