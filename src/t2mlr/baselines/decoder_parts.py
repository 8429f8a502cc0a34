"""What the looped and the pause-token baselines share: a config around a base decoder's config, a
backbone that runs the base decoder's parts with a cache of its own, and the causal LM over it.

Both run the base model's own embedding, blocks, rotary embedding, final norm and LM head, in an order
of their own. Everything a T²MLR model also does comes from `t2mlr.model`: rebuilding a saved base
config and inheriting its special tokens (`configuration`), checking the inputs and laying out the
chunk's positions, padding and packed documents (`checks`, `layout`), and wrapping a decoder without
copying or re-initialising its weights (`wrapping`). This module adds only what differs: which model
families a baseline may wrap (the widened Llama of the matched Transformer too), the settings schema
read from each config's signature, and the hooks for each baseline's own cache.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from transformers import (
    DynamicCache,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from t2mlr.baselines.transformer import MatchedLlamaConfig
from t2mlr.model import checks
from t2mlr.model.configuration import (
    WrapsBaseConfig,
    _as_base_config,
    inherit_base_fields,
    resolve_base_config,
)
from t2mlr.model.layout import TokenLayout
from t2mlr.model.pretrained import load_pretrained_base
from t2mlr.model.wrapping import DecoderBackbone, LMHeadOverBackbone, base_decoder, follow_placement
from t2mlr.settings import SUPPORTED_MODEL_TYPES as T2MLR_MODEL_TYPES
from t2mlr.settings import settings_fields, take_settings
from t2mlr.utils import Field, check_known_names

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "WrappedDecoderConfig",
    "WrappedDecoderForCausalLM",
    "WrappedDecoderModel",
    "check_no_extra_outputs",
    "check_positive_int",
]

SUPPORTED_MODEL_TYPES = (*T2MLR_MODEL_TYPES, MatchedLlamaConfig.model_type)


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_no_extra_outputs(kwargs: dict[str, Any]) -> None:
    """These baselines return logits (and the cache) only; asking for more is refused, not ignored."""
    for name in ("output_attentions", "output_hidden_states"):
        if kwargs.get(name):
            raise ValueError(f"{name}=True is not supported by this baseline")


class WrappedDecoderConfig(WrapsBaseConfig, PretrainedConfig):
    """A base decoder's config plus a baseline's settings: the fields of its `settings` class (pure data in
    `t2mlr.settings`), which the trainer's YAML and `from_base` are checked against. Subclasses name that
    class and implement `check_settings`."""

    wrapper_name: ClassVar[str] = "baseline"
    settings: ClassVar[type]

    def __init__(self, base_config: PretrainedConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.base_config = _as_base_config(base_config)
        for name, value in take_settings(self.settings, kwargs).items():
            setattr(self, name, value)
        inherit_base_fields(self.base_config, kwargs)
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.check_base()
            self.check_settings()

    @classmethod
    def settings_fields(cls) -> dict[str, Field]:
        """The baseline's settings (its `settings` class's fields), typed, with defaults."""
        return settings_fields(cls.settings)

    @classmethod
    def from_base(cls, base_config: PretrainedConfig | dict[str, Any] | str, **settings: Any) -> WrappedDecoderConfig:
        """This baseline around a base config: an object, a dict of its fields with `model_type` (checked
        key by key) or a hub id / local path. `settings` are this config's fields only."""
        check_known_names(settings, cls.settings_fields(), f"{cls.__name__} field")
        return cls(base_config=resolve_base_config(base_config), **settings)

    def check_base(self) -> None:
        model_type = getattr(self.require_base_config(), "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"the {self.wrapper_name} cannot wrap base model type {model_type!r}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )

    def check_settings(self) -> None:
        """Check (and where a setting is a shorthand, resolve) the subclass's fields against the base."""
        raise NotImplementedError


class WrappedDecoderModel(DecoderBackbone, PreTrainedModel):
    """A baseline's backbone: the base decoder's parts (`DecoderBackbone`) plus modules of its own, with a
    cache class of its own. Subclasses set `config_class`, may add modules in `build_own_modules`
    (initialised by `post_init`, placed like the embedding), implement `new_cache`, `fits_cache` and
    `forward` (returning the final-norm hidden states at the real tokens)."""

    config_class = WrappedDecoderConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: WrappedDecoderConfig, decoder: nn.Module | None = None) -> None:
        """`decoder`: the base decoder's inner model whose parts become this model's; None builds a fresh one."""
        super().__init__(config)
        config.check_base()
        config.check_settings()
        self.adopt_decoder_parts(decoder)
        own = self.build_own_modules()
        self.post_init()
        follow_placement(self.embed_tokens.weight, own)

    def build_own_modules(self) -> list[nn.Module]:
        """Create the modules this baseline adds to the base model (none by default) and return them."""
        return []

    def checked_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        past_key_values: Any,
        use_cache: bool | None,
        max_positions: int | None,
        extra: dict[str, Any],
    ) -> tuple[DynamicCache | None, TokenLayout, torch.Tensor | None]:
        """The cache to use (the given one, checked, or a new one when use_cache=True) and the chunk's
        token layout and attention mask, after every input check of `t2mlr.model.checks`."""
        check_no_extra_outputs(extra)
        cache = self._resolve_cache(past_key_values, use_cache)
        layout, attention_mask = checks.checked_chunk(
            input_ids, inputs_embeds, attention_mask, position_ids, cache, self.config.hidden_size,
            self.config.vocab_size, max_positions,
        )
        return cache, layout, attention_mask

    def new_cache(self, offloading: bool = False) -> DynamicCache:
        """An empty cache of this model's own class."""
        raise NotImplementedError

    def fits_cache(self, cache: Any) -> bool:
        """Whether `cache` was built for this model's config (its class and layout)."""
        raise NotImplementedError

    def _resolve_cache(self, past_key_values: Any, use_cache: bool | None) -> DynamicCache | None:
        if past_key_values is None:
            return self.new_cache() if use_cache else None
        if use_cache is False:
            raise ValueError("use_cache=False contradicts the past_key_values that was passed")
        if not self.fits_cache(past_key_values):
            expected = type(self.new_cache()).__name__
            raise ValueError(
                f"past_key_values must be a {expected} built from this model's config, got "
                f"{type(past_key_values).__name__}"
            )
        return past_key_values


class WrappedDecoderForCausalLM(LMHeadOverBackbone, PreTrainedModel, GenerationMixin):
    """A baseline's causal LM: its backbone (`backbone_class`, under `model`) and the base decoder's head."""

    config_class = WrappedDecoderConfig
    backbone_class: ClassVar[type[WrappedDecoderModel]] = WrappedDecoderModel
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: WrappedDecoderConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        decoder = base_decoder(config.base_config, config._attn_implementation, base_model, f"the {config.wrapper_name}")
        self.model = self.backbone_class(config, decoder=decoder.model)
        self.lm_head = decoder.lm_head
        self.post_init()

    @classmethod
    def wrap(
        cls, base: PreTrainedModel | PretrainedConfig | str, load_kwargs: dict[str, Any] | None = None, **settings: Any
    ) -> WrappedDecoderForCausalLM:
        """This baseline around a base decoder: a model object is adopted, not copied (its modules become
        this model's and keep their weights; pass `copy.deepcopy(base)` to keep the original), a hub id /
        local path is loaded first, a config gives a freshly initialised model. `settings` are the config's
        fields only."""
        if load_kwargs and not isinstance(base, str):
            raise ValueError("load_kwargs applies only when `base` is a hub id or path")
        if isinstance(base, str):
            base, _ = load_pretrained_base(base, with_tokenizer=False, **(load_kwargs or {}))
        if isinstance(base, PretrainedConfig):
            return cls(cls.config_class.from_base(base, **settings))
        if not isinstance(base, PreTrainedModel):
            raise ValueError(f"base must be a model, a config, or a hub id / path, got {type(base).__name__}")
        return cls(cls.config_class.from_base(base.config, **settings), base_model=base)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **loss_kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Causal-LM forward over real tokens: the backbone, then the LM head at the kept positions. Labels
        are standard causal-LM labels (shifted inside, -100 ignored); a cache is used when
        `past_key_values` is passed (the model's own class) or created when `use_cache=True`."""
        checks.checked_labels(labels, input_ids, inputs_embeds, self.config.vocab_size)
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        logits, loss = self.logits_and_loss(out.last_hidden_state, labels, logits_to_keep, **loss_kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values)

    def _prepare_cache_for_generation(
        self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any
    ) -> Any:
        """generate() gets this model's own cache instead of the per-block `DynamicCache` it would build."""
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            model_kwargs["past_key_values"] = self.model.new_cache()
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
