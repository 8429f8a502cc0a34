"""What every model that drives a wrapped Hugging Face decoder shares: T²MLR here, and the looped and
pause-token baselines of `t2mlr.baselines`.

Such a model holds a `*ForCausalLM` (Llama, Mistral, Qwen2, Qwen3) as `self.base` and runs its
embedding, decoder blocks, rotary embedding, final norm and LM head in an order of its own. Wrapping a
pretrained decoder must neither copy its weights nor re-initialise them, and the blocks a model runs
several times per step are the ones worth checkpointing; both are written once, here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .layout import LayerInputs

WRAPPABLE_PARTS = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")


def check_wrappable(base: nn.Module, model_name: str = "T²MLR") -> None:
    """The parts a wrapper drives exist on `base`; the message names the first missing one."""
    for dotted in WRAPPABLE_PARTS:
        owner = base
        for name in dotted.split("."):
            owner = getattr(owner, name, None)
        if owner is None:
            raise ValueError(
                f"cannot wrap {type(base).__name__}: {model_name} needs a *ForCausalLM with "
                f"{', '.join('.' + part for part in WRAPPABLE_PARTS)} (Llama, Mistral, Qwen2, Qwen3); "
                f"{'.' + dotted} is missing"
            )


def keep_initialised(base_model: PreTrainedModel) -> None:
    """Mark a given base model's weights as initialised, so `post_init` of the wrapper leaves them as
    they are (no re-initialisation, no copy of the state dict to restore them)."""
    for module in base_model.modules():
        module._is_hf_initialized = True


def wrapped_base(
    base_config: PretrainedConfig, attn_implementation: str | None, base_model: PreTrainedModel | None, model_name: str
) -> PreTrainedModel:
    """The decoder a wrapper drives: `base_model` as it is (marked initialised, not copied), or a fresh
    one built from `base_config`; checked to expose the parts the wrapper runs."""
    if base_model is None:
        base_model = AutoModelForCausalLM.from_config(base_config, attn_implementation=attn_implementation)
    else:
        keep_initialised(base_model)
    check_wrappable(base_model, model_name)
    return base_model


def follow_base_placement(base_model: PreTrainedModel, modules: Iterable[nn.Module | None]) -> None:
    """Move a wrapper's own new modules to the device and dtype of the base model's embedding."""
    reference = base_model.model.embed_tokens.weight
    for module in modules:
        if module is not None:
            module.to(device=reference.device, dtype=reference.dtype)


def checkpoint_blocks(layers: nn.ModuleList, indices: Iterable[int], enabled: bool) -> None:
    """Activation checkpointing of chosen decoder blocks only (each run of a block recomputes its
    activations in backward). transformers' decoder layers read these two attributes."""
    for i in indices:
        layers[i].gradient_checkpointing = enabled
        layers[i]._gradient_checkpointing_func = lambda fn, *a: checkpoint(fn, *a, use_reentrant=False)


def logits_positions(logits_to_keep: int | torch.Tensor) -> slice | torch.Tensor:
    """Which positions get logits: the last `n` (0 = all) or explicit indices, as in transformers."""
    return slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep


class WrapsBaseDecoder:
    """Mixin of a `PreTrainedModel` that holds its decoder as `self.base` (list it before PreTrainedModel).

    Embedding accessors and weight initialisation go to the base model; the attention backends and
    device-map splits are the base decoder's; `run_block` calls one decoder block with a chunk's shared
    inputs; `head_and_loss` ends a forward the way the base model would.
    """

    base: PreTrainedModel
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"]

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.base.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    @property
    def layers(self) -> nn.ModuleList:
        """The base model's decoder blocks."""
        return self.base.model.layers

    def _init_weights(self, module: nn.Module) -> None:
        """New modules are initialised the way the base model initialises its own."""
        if hasattr(self, "base"):
            self.base._init_weights(module)

    def run_block(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: Any = None) -> torch.Tensor:
        """Decoder block `index` (0-based) on the chunk; `cache` defaults to the chunk's own (None: none)."""
        cache = inputs.cache if cache is None else cache
        return self.layers[index](
            hidden,
            attention_mask=inputs.masks[index],
            position_ids=inputs.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=inputs.position_embeddings,
        )

    def head_and_loss(
        self, hidden: torch.Tensor, labels: torch.Tensor | None, logits_to_keep: int | torch.Tensor, **loss_kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final norm and LM head at the kept positions, and the causal-LM loss (labels shifted inside,
        -100 ignored) when labels are given."""
        logits = self.base.lm_head(self.base.model.norm(hidden[:, logits_positions(logits_to_keep)]))
        loss = None
        if labels is not None:
            loss = self.base.loss_function(
                logits=logits, labels=labels, vocab_size=self.base.config.vocab_size, **loss_kwargs
            )
        return logits, loss
