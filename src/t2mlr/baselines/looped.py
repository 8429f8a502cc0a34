"""Looped Transformer baseline: a Hugging Face decoder whose blocks loop_start..loop_end run `loops` times.

The paper (§4.2, Table "looped_baselines") compares T²MLR with a full-looped ×2 Transformer (every
block runs twice per token) and a middle-looped ×3 Transformer (blocks 9–22 of 30 run three times),
parameter-matched to T²MLR (`t2mlr.baselines.matching`). Looping reuses weights, so it adds
depth of computation but no parameters.

The looped range is written `loop_blocks="9-22"` (1-based, inclusive, as T²MLR's placements) or
`loop_blocks="full"` (every block), or as `loop_start` / `loop_end`. Forward, for a range s..e and K = `loops`:

    blocks 1..s-1 once → (blocks s..e) K times, in block order each time → blocks e+1..L once → norm → LM head

This is the base `*ForCausalLM`'s own embedding, blocks, rotary embedding, masks and head, only run
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
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    Cache,
    get_layer_types_and_kwargs,
)
from transformers.modeling_outputs import BaseModelOutputWithPast

from t2mlr.baselines.decoder_parts import (
    WrappedDecoderConfig,
    WrappedDecoderForCausalLM,
    WrappedDecoderModel,
    check_positive_int,
)
from t2mlr.settings import LoopedSettings, check_block_range
from t2mlr.model.wrapping import checkpoint_blocks

__all__ = ["CacheSlot", "LoopedCache", "LoopedConfig", "LoopedForCausalLM", "LoopedModel", "parse_loop_blocks"]

FULL = "full"


def parse_loop_blocks(loop_blocks: Any, num_layers: int) -> tuple[int, int]:
    """`"full"` → (1, L); `"9-22"` → (9, 22): the 1-based, inclusive range a `loop_blocks` setting names
    (its bounds are checked against the model by `LoopedConfig`)."""
    if loop_blocks == FULL:
        return 1, num_layers
    text = str(loop_blocks).strip() if isinstance(loop_blocks, str) else ""
    start, sep, end = text.partition("-")
    if not (sep and start.strip().isdigit() and end.strip().isdigit()):
        raise ValueError(
            f"loop_blocks must be 'full' or 'S-E' with 1-based, inclusive block numbers (e.g. '9-22'), got {loop_blocks!r}"
        )
    return int(start), int(end)


class LoopedConfig(WrappedDecoderConfig):
    """A base decoder's config plus the looped block range (`t2mlr.settings.LoopedSettings`: loop_blocks,
    loop_start, loop_end, loops)."""

    model_type = "t2mlr_looped"
    wrapper_name = "looped Transformer"
    settings = LoopedSettings

    def __init__(self, base_config: PretrainedConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        # Declared, though it only passes on: transformers gives a config class without an `__init__` a dataclass one.
        super().__init__(base_config, **kwargs)

    def check_settings(self) -> None:
        """Resolve `loop_blocks` into loop_start / loop_end, then check the range and the loop count."""
        n = self.num_layers
        if self.loop_blocks is not None:
            start, end = parse_loop_blocks(self.loop_blocks, n)
            for name, parsed in (("loop_start", start), ("loop_end", end)):
                given = getattr(self, name)
                if given is not None and given != parsed:
                    raise ValueError(
                        f"loop_blocks={self.loop_blocks!r} names blocks {start}-{end}, but {name}={given!r} was also "
                        "given; set loop_blocks or loop_start/loop_end, not both"
                    )
            self.loop_start, self.loop_end = start, end
        if self.loop_start is None or self.loop_end is None:
            raise ValueError(
                "name the looped blocks: loop_blocks='full' or 'S-E' (1-based, inclusive, e.g. '9-22'), "
                "or both loop_start and loop_end"
            )
        check_block_range(self.loop_start, self.loop_end, n, ("loop_start", "loop_end"))
        check_positive_int("loops", self.loops)

    def looped_indices(self) -> range:
        """0-based indices of the looped blocks (each appears once: they share their weights)."""
        return range(self.loop_start - 1, self.loop_end)

    def block_schedule(self) -> list[int]:
        """0-based block index of every block application, in execution order (one KV slot each)."""
        before = list(range(self.loop_start - 1))
        after = list(range(self.loop_end, self.num_layers))
        return before + list(self.looped_indices()) * self.loops + after

    @property
    def block_cost_ratio(self) -> float:
        """Decoder-block FLOPs (and KV-cache size) per token relative to the base model: (L + (K−1)·D) / L."""
        return len(self.block_schedule()) / self.num_layers

    def describe(self) -> str:
        """E.g. "looped blocks 9-22 × 3 (of 30)"."""
        return f"looped blocks {self.loop_start}-{self.loop_end} × {self.loops} (of {self.num_layers})"


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
        if isinstance(kinds_kwargs, dict):  # transformers < 5.19: one kwargs dict for every layer, not a list
            kinds_kwargs = [kinds_kwargs] * len(kinds)
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


class LoopedModel(WrappedDecoderModel):
    """The looped backbone: the base decoder's blocks in `config.block_schedule()` order (module docstring)."""

    config_class = LoopedConfig

    def new_cache(self, offloading: bool = False) -> LoopedCache:
        return LoopedCache(self.config, offloading=offloading)

    def set_loop_checkpointing(self, enabled: bool) -> None:
        """Activation checkpointing of the looped blocks only: they run `loops` times per step, so they hold
        most of the activations that gradients need; each run recomputes its own in backward."""
        checkpoint_blocks(self.layers, self.config.looped_indices(), enabled)

    def fits_cache(self, cache: Any) -> bool:
        return isinstance(cache, LoopedCache) and cache.block_schedule == tuple(self.config.block_schedule())

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: LoopedCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """The final-norm hidden states after the block schedule. A cache is used when `past_key_values` is
        passed (a `LoopedCache`) or created when `use_cache=True`."""
        base_config = self.config.base_config
        cache, layout, attention_mask = self.checked_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache,
            getattr(base_config, "max_position_embeddings", None), kwargs,
        )
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        inputs = self.chunk_inputs(hidden, attention_mask, layout, cache)
        for slot, block in enumerate(self.config.block_schedule()):
            hidden = self.run_block(block, hidden, inputs, None if cache is None else CacheSlot(cache, slot, block))
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden), past_key_values=cache)


class LoopedForCausalLM(WrappedDecoderForCausalLM):
    """Looped causal LM over a Hugging Face decoder (see the module docstring)."""

    config_class = LoopedConfig
    backbone_class = LoopedModel

    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | PretrainedConfig | str,
        loop_start: int | None = None,
        loop_end: int | None = None,
        loops: int = 1,
        load_kwargs: dict[str, Any] | None = None,
        loop_blocks: str | None = None,
    ) -> LoopedForCausalLM:
        """A looped model around a base decoder (see `WrappedDecoderForCausalLM.wrap`): a model object keeps
        its weights, a hub id / local path is loaded first, a config gives a freshly initialised model."""
        return cls.wrap(base, load_kwargs, loop_blocks=loop_blocks, loop_start=loop_start, loop_end=loop_end,
                        loops=loops)
