"""Looped Transformer baseline: a Hugging Face decoder whose blocks loop_start..loop_end run `loops` times.

The paper (§4.2, Table "looped_baselines") compares T²MLR with a full-looped ×2 Transformer (every
block runs twice per token) and a middle-looped ×3 Transformer (blocks 9–22 of 30 run three times),
parameter-matched to T²MLR (`t2mlr.baselines.baseline_matching`). Looping reuses weights, so it adds
depth of computation but no parameters.

Forward, for a 1-based inclusive range s..e and K = `loops`:

    blocks 1..s-1 once → (blocks s..e) K times, in block order each time → blocks e+1..L once → norm → LM head

This is the wrapped `*ForCausalLM`'s own embedding, blocks, rotary embedding, masks and head, only run
in that order (`LoopedConfig.block_schedule()`); K = 1 is exactly the base model. Every run of a block
is a separate *application* with its own keys and values: application i (in execution order) owns KV
slot i of a `LoopedCache`, a `DynamicCache` with one layer per application. The blocks write to the
cache through `self_attn.layer_idx`, which names the block, not the application, so each application
gets a `CacheSlot` view that routes the block's `update` to its own slot. Because every application
keeps its own keys, decoding with the cache reproduces the full forward token by token, and beam
search, batch expansion and cropping act on all slots through `DynamicCache` itself.

Per-token decode cost relative to the plain model (decoder-block FLOPs and KV-cache size):
full loop ×K ≈ K×; middle loop of D blocks out of L ≈ (L + (K−1)·D)/L, e.g. blocks 9–22 of 30 at K = 3:
(30 + 2·14)/30 ≈ 1.93×. `LoopedConfig.block_cost_ratio` computes it. The embedding and the LM head run
once per token, so the whole model's ratio is a little lower where the head is a large share (SmolLM2-135M
at hidden 584: the 28.7M-parameter tied head is ~21% of the matmul FLOPs, so full ×2 ≈ 1.79× and middle ×3
≈ 1.74× in total). The loops run one after another, so decode latency grows the same way; training
FLOPs grow by the same factors.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DynamicCache,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, get_layer_types_and_kwargs
from transformers.modeling_outputs import CausalLMOutputWithPast

from t2mlr.baselines.decoder_parts import (
    as_base_config,
    attention_masks,
    block_attention_kinds,
    build_base_model,
    check_attention_mask,
    check_no_extra_outputs,
    check_positive_int,
    check_supported_base,
    chunk_position_ids,
    chunk_shape,
    inherit_special_tokens,
    kept_positions,
    wrap_pretrained,
)

__all__ = ["CacheSlot", "LoopedCache", "LoopedConfig", "LoopedForCausalLM"]


class LoopedConfig(PretrainedConfig):
    """A base decoder's config plus the looped block range.

    Args:
        base_config: config of the wrapped decoder (Llama, Mistral, Qwen2, Qwen3 or the matched Llama).
        loop_start, loop_end: first and last looped block, 1-based and inclusive (1..L loops every block).
        loops: how many times the range runs per token (K >= 1; 1 is the base model).
    """

    model_type = "t2mlr_looped"

    def __init__(
        self,
        base_config: PretrainedConfig | dict[str, Any] | None = None,
        loop_start: int = 1,
        loop_end: int = 1,
        loops: int = 1,
        **kwargs: Any,
    ) -> None:
        self.base_config = as_base_config(base_config)
        self.loop_start = loop_start
        self.loop_end = loop_end
        self.loops = loops
        inherit_special_tokens(self.base_config, kwargs)
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.validate_loop()

    @classmethod
    def from_base(
        cls,
        base_config: PretrainedConfig | dict[str, Any] | str,
        loop_start: int,
        loop_end: int,
        loops: int,
        **kwargs: Any,
    ) -> LoopedConfig:
        """A looped config around a base config (object, dict, or hub id / local path)."""
        if isinstance(base_config, str):
            base_config = AutoConfig.from_pretrained(base_config)
        return cls(base_config=base_config, loop_start=loop_start, loop_end=loop_end, loops=loops, **kwargs)

    @property
    def num_layers(self) -> int:
        return int(self.base_config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.base_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.base_config.vocab_size)

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        """Generation reads the vocabulary and special tokens from the wrapped decoder's config."""
        return self.base_config

    def validate_loop(self) -> None:
        """Check the base family and the loop fields; the message names the value and what is allowed."""
        check_supported_base(self.base_config, "looped Transformer")
        n = self.num_layers
        for name in ("loop_start", "loop_end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= self.loop_start <= self.loop_end <= n:
            raise ValueError(
                f"need 1 <= loop_start <= loop_end <= {n} (1-based, inclusive block indices of a {n}-block model); "
                f"got loop_start={self.loop_start}, loop_end={self.loop_end}"
            )
        check_positive_int("loops", self.loops)

    def block_schedule(self) -> list[int]:
        """0-based block index of every block application, in execution order (one KV slot each)."""
        before = list(range(self.loop_start - 1))
        looped = list(range(self.loop_start - 1, self.loop_end)) * self.loops
        after = list(range(self.loop_end, self.num_layers))
        return before + looped + after

    @property
    def block_cost_ratio(self) -> float:
        """Decoder-block FLOPs (and KV-cache size) per token relative to the base model: (L + (K−1)·D) / L."""
        return len(self.block_schedule()) / self.num_layers


class LoopedCache(DynamicCache):
    """A `DynamicCache` with one layer per block application of `config.block_schedule()`.

    Each slot has the cache layer type of its block (full or sliding window), so masks and memory
    follow the base model's layout; the blocks reach their slots through `CacheSlot` views.
    """

    def __init__(self, config: LoopedConfig, offloading: bool = False) -> None:
        if not isinstance(config, LoopedConfig):
            raise ValueError(f"LoopedCache needs the LoopedConfig of its model, got {type(config).__name__}")
        kinds, kinds_kwargs = get_layer_types_and_kwargs(config.base_config.get_text_config(decoder=True))
        schedule = config.block_schedule()
        layers = [DYNAMIC_LAYER_TYPE_MAPPING[kinds[block]](**kinds_kwargs[block]) for block in schedule]
        # the slot layout replaces the per-block one DynamicCache.__init__ would build
        Cache.__init__(self, layers=layers, offloading=offloading, offload_only_non_sliding=False)
        self.block_schedule = tuple(schedule)


class CacheSlot:
    """What one block application sees as its KV cache: its own slot of the shared `LoopedCache`.

    The decoder blocks of the supported families only call `update(keys, values, layer_idx)` on the
    cache they are given (masks are built from the `LoopedCache` itself), so this view forwards that
    one call, to slot `slot` instead of the block's `layer_idx`.
    """

    __slots__ = ("block", "cache", "slot")

    def __init__(self, cache: LoopedCache, slot: int, block: int) -> None:
        self.cache, self.slot, self.block = cache, slot, block

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx != self.block:
            raise RuntimeError(f"KV slot {self.slot} belongs to block {self.block}, but block {layer_idx} wrote to it")
        return self.cache.update(key_states, value_states, self.slot, *args, **kwargs)


class LoopedForCausalLM(PreTrainedModel, GenerationMixin):
    """Looped causal LM over a Hugging Face decoder (see the module docstring)."""

    config_class = LoopedConfig
    base_model_prefix = "looped"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"]

    def __init__(self, config: LoopedConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.validate_loop()
        if base_model is None:
            base_model = build_base_model(config.base_config, config._attn_implementation, "looped Transformer")
        self.base = base_model
        self.post_init()

    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | PretrainedConfig | str,
        loop_start: int,
        loop_end: int,
        loops: int,
        load_kwargs: dict[str, Any] | None = None,
    ) -> LoopedForCausalLM:
        """A looped model around a base decoder: a model object keeps its weights, a hub id / local path is
        loaded first, a config gives a freshly initialised model."""
        if load_kwargs and not isinstance(base, str):
            raise ValueError("load_kwargs applies only when `base` is a hub id or path")
        if isinstance(base, str):
            base = AutoModelForCausalLM.from_pretrained(base, **(load_kwargs or {}))
        if isinstance(base, PretrainedConfig):
            return cls(LoopedConfig.from_base(base, loop_start, loop_end, loops))
        if not isinstance(base, PreTrainedModel):
            raise ValueError(f"base must be a model, a config, or a hub id / path, got {type(base).__name__}")
        return wrap_pretrained(cls, LoopedConfig.from_base(base.config, loop_start, loop_end, loops), base)

    def _init_weights(self, module: torch.nn.Module) -> None:
        if hasattr(self, "base"):
            self.base._init_weights(module)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.base.get_input_embeddings()

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.base.set_input_embeddings(value)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.base.get_output_embeddings()

    @property
    def layers(self) -> torch.nn.ModuleList:
        """The base model's decoder blocks (each looped block appears once: weights are shared)."""
        return self.base.model.layers

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: LoopedCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Causal-LM forward; labels are standard causal-LM labels (shifted inside, -100 ignored). A cache
        is used when `past_key_values` is passed (a `LoopedCache`) or created when `use_cache=True`."""
        check_no_extra_outputs(kwargs)
        base_config = self.base.config
        batch, length = chunk_shape(input_ids, inputs_embeds, self.config.hidden_size, self.config.vocab_size)
        cache = self._resolve_cache(past_key_values, use_cache)
        past = cache.get_seq_length() if cache is not None else 0
        attention_mask = check_attention_mask(attention_mask, batch, past + length)
        hidden = self.base.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        positions = chunk_position_ids(attention_mask, position_ids, past, batch, length, hidden.device)
        masks = attention_masks(base_config, hidden, attention_mask, cache, positions)
        rotary = self.base.model.rotary_emb(hidden, position_ids=positions)
        kinds = block_attention_kinds(base_config)
        for slot, block in enumerate(self.config.block_schedule()):
            hidden = self.layers[block](
                hidden,
                attention_mask=masks[kinds[block]],
                position_ids=positions,
                past_key_values=None if cache is None else CacheSlot(cache, slot, block),
                use_cache=cache is not None,
                position_embeddings=rotary,
            )
        hidden = self.base.model.norm(hidden[:, kept_positions(logits_to_keep)])
        logits = self.base.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = self.base.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    def _resolve_cache(self, past_key_values: Any, use_cache: bool | None) -> LoopedCache | None:
        if past_key_values is None:
            return LoopedCache(self.config) if use_cache else None
        if use_cache is False:
            raise ValueError("use_cache=False contradicts the past_key_values that was passed")
        slots = len(self.config.block_schedule())
        if not isinstance(past_key_values, LoopedCache) or len(past_key_values.layers) != slots:
            raise ValueError(
                f"past_key_values must be a LoopedCache built from this model's config ({slots} KV slots, one per "
                f"block application), got {type(past_key_values).__name__}"
            )
        return past_key_values

    def _prepare_cache_for_generation(
        self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any
    ) -> None:
        """generate() gets a `LoopedCache`: the default `DynamicCache` it would build has one slot per
        block, not per block application."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        cache = model_kwargs.get("past_key_values")
        if type(cache) is DynamicCache and not getattr(cache, "_is_user_defined", False):
            model_kwargs["past_key_values"] = LoopedCache(self.config, offloading=cache.offloading)
