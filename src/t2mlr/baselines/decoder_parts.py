"""What the looped and the pause-token baselines share: a config around a base decoder's config, and a
causal LM that drives the wrapped `*ForCausalLM` with a cache of its own.

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

from t2mlr.baselines.transformer import MatchedLlamaConfig
from t2mlr.model import checks
from t2mlr.model.configuration import SUPPORTED_MODEL_TYPES as T2MLR_MODEL_TYPES
from t2mlr.model.configuration import (
    WrapsBaseConfig,
    _as_base_config,
    inherit_base_fields,
    resolve_base_config,
)
from t2mlr.model.layout import TokenLayout
from t2mlr.model.pretrained import load_pretrained_base
from t2mlr.model.wrapping import WrapsBaseDecoder, follow_base_placement, wrapped_base
from t2mlr.utils import Field, check_known_names, signature_fields

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "WrappedDecoderConfig",
    "WrappedDecoderForCausalLM",
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
    """A base decoder's config plus a baseline's settings: the `__init__` parameters of the subclass
    after `base_config` (`settings_fields()`), which the trainer's YAML and `from_base` are checked
    against. Subclasses set their fields, call this `__init__`, and implement `check_settings`."""

    wrapper_name: ClassVar[str] = "baseline"

    def __init__(self, base_config: PretrainedConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.base_config = _as_base_config(base_config)
        inherit_base_fields(self.base_config, kwargs)
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.check_base()
            self.check_settings()

    @classmethod
    def settings_fields(cls) -> dict[str, Field]:
        """The baseline's settings (every `__init__` parameter but `base_config`), typed, with defaults."""
        return signature_fields(cls.__init__, exclude=("base_config",))

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


class WrappedDecoderForCausalLM(WrapsBaseDecoder, PreTrainedModel, GenerationMixin):
    """A causal LM over a wrapped Hugging Face decoder, with its own cache class.

    Subclasses set `config_class`, may add modules of their own in `build_own_modules` (initialised by
    `post_init`, placed like the base model), and implement `new_cache` and `fits_cache`.
    """

    config_class = WrappedDecoderConfig
    main_input_name = "input_ids"

    def __init__(self, config: WrappedDecoderConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.check_base()
        config.check_settings()
        self.base = wrapped_base(config.base_config, config._attn_implementation, base_model, f"the {config.wrapper_name}")
        own = self.build_own_modules()
        self.post_init()
        follow_base_placement(self.base, own)

    def build_own_modules(self) -> list[nn.Module]:
        """Create the modules this baseline adds to the base model (none by default) and return them."""
        return []

    @classmethod
    def wrap(
        cls, base: PreTrainedModel | PretrainedConfig | str, load_kwargs: dict[str, Any] | None = None, **settings: Any
    ) -> WrappedDecoderForCausalLM:
        """This baseline around a base decoder: a model object is wrapped, not copied (its modules become
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

    # ----------------------------------------------------------------------------- inputs and cache
    def checked_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
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
            input_ids, inputs_embeds, attention_mask, position_ids, labels, cache, self.config.hidden_size,
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

    def _prepare_cache_for_generation(
        self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any
    ) -> Any:
        """generate() gets this model's own cache instead of the per-block `DynamicCache` it would build."""
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            model_kwargs["past_key_values"] = self.new_cache()
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
