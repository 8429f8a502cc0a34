"""Pause-token baseline: every real token is followed by `pauses` learnable pause tokens.

The paper (§4.2, Table "looped_baselines") compares T²MLR with a "pause-token ×2" model after Goyal et
al., "Think before you speak: Training Language Models With Pause Tokens" (arXiv 2310.02226).

How we read Goyal et al. and what we kept:

* A pause token is a learnable embedding added to the vocabulary. The model is never trained to predict
  it: loss terms whose target is a pause token are dropped, and the prediction of the next real token
  is read at the *last* pause before it, so the pauses' computation feeds the prediction.
* Goyal et al. insert pauses at random places during pretraining and append a block of pauses to the
  prompt downstream. The paper's baseline is a fixed compute multiplier ("×2"), so we use the dense,
  deterministic layout: P − 1 = `pauses` pause tokens after *every* real token,

      x1 p x2 p x3 p ...          (×2, pauses = 1)

  The output at the pause after x_t predicts x_{t+1}; the outputs at real tokens (whose next token is a
  pause) and at earlier pauses of a group are never scored. Because the layout is fixed, generation can
  insert the pauses itself and the model is a drop-in causal LM over real tokens.
* Goyal et al. use one `<pause>` token repeated; we give each of the `pauses` slots its own embedding
  (ids pause_token_id .. pause_token_id + pauses − 1, by default vocab_size .. vocab_size + pauses − 1).
  For the paper's ×2 (one pause) the two are identical; with more pauses, distinct embeddings let a slot
  know where it is in its group at a cost of pauses·d parameters (counted in the matching).

Interface: `input_ids`, `attention_mask`, `position_ids` and `labels` cover real tokens only (shape
(batch, seq)); the pauses are inserted inside, and logits are returned at real positions only (batch,
seq, vocab), logits[:, t] being read at the last pause after token t. Labels follow the usual causal-LM
shift (logits[:, t] is scored against labels[:, t+1], -100 ignored), so no loss ever falls on a pause
position. Pause positions inherit their token's padding bit and get positions p·P + j (p the token's
position), so left padding is masked out, a row's logits do not depend on its padding, and packed
documents (positions restarting at 0) keep their pauses inside them. A sliding attention window
(Mistral) counts interleaved positions, so it spans window / P real tokens.

The LM head has no rows for pause tokens: a pause's output is never scored, so such rows would never be
trained, and without them the model *cannot* generate a pause token (no sampling trick needed). It also
keeps a tied embedding/LM-head matrix exactly the base model's: the pause embeddings are a separate
`nn.Embedding(pauses, hidden)`.

Cache: a `PauseCache` holds keys of the interleaved sequence but reports lengths in real tokens
(`get_seq_length`, `crop`), which is what `generate()` slices its inputs by; each decode step feeds one
real token and its pauses (a chunk of P), and equals the full forward.

Per-token decode cost relative to the plain model, with P = pauses + 1: every real token is P tokens
through the whole decoder, so projections and MLPs cost P×, the KV cache is P× longer, and attention,
P queries over a P× longer context, costs P²× at equal real context (quadratic in the doubled length);
prefill and training attention over the P·n-token sequence likewise cost P²×, everything else P×.
The LM head runs only at the last pause of each group, i.e. once per real token (SmolLM2-135M at hidden
584, ×2: ≈ 1.79× the matmul FLOPs at short context, growing towards the attention's 4× as the context
lengthens).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DynamicCache,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
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

__all__ = ["PauseCache", "PauseConfig", "PauseForCausalLM"]


class PauseConfig(PretrainedConfig):
    """A base decoder's config plus the pause layout.

    Args:
        base_config: config of the wrapped decoder (Llama, Mistral, Qwen2, Qwen3 or the matched Llama).
        pauses: pause tokens after every real token (P − 1 for a ×P model; 1 for the paper's ×2).
        pause_token_id: id of the first pause token (default: the base vocabulary size); pause j has id
            pause_token_id + j. Must not collide with the vocabulary [0, vocab_size).
    """

    model_type = "t2mlr_pause"

    def __init__(
        self,
        base_config: PretrainedConfig | dict[str, Any] | None = None,
        pauses: int = 1,
        pause_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.base_config = as_base_config(base_config)
        self.pauses = pauses
        if pause_token_id is None and self.base_config is not None:
            pause_token_id = int(self.base_config.vocab_size)
        self.pause_token_id = pause_token_id
        inherit_special_tokens(self.base_config, kwargs)
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.validate_pauses()

    @classmethod
    def from_base(cls, base_config: PretrainedConfig | dict[str, Any] | str, pauses: int, **kwargs: Any) -> PauseConfig:
        """A pause config around a base config (object, dict, or hub id / local path)."""
        if isinstance(base_config, str):
            base_config = AutoConfig.from_pretrained(base_config)
        return cls(base_config=base_config, pauses=pauses, **kwargs)

    @property
    def hidden_size(self) -> int:
        return int(self.base_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.base_config.vocab_size)

    @property
    def period(self) -> int:
        """P: tokens the decoder runs per real token (the token and its pauses)."""
        return self.pauses + 1

    @property
    def pause_token_ids(self) -> list[int]:
        return list(range(self.pause_token_id, self.pause_token_id + self.pauses))

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        """Generation reads the (real) vocabulary and special tokens from the wrapped decoder's config."""
        return self.base_config

    def validate_pauses(self) -> None:
        check_supported_base(self.base_config, "pause-token model")
        check_positive_int("pauses", self.pauses)
        first = self.pause_token_id
        if isinstance(first, bool) or not isinstance(first, int) or first < self.vocab_size:
            raise ValueError(
                f"pause_token_id must be an int >= vocab_size={self.vocab_size} (pause ids may not collide with the "
                f"vocabulary [0, {self.vocab_size})), got {first!r}"
            )


class PauseCache(DynamicCache):
    """A `DynamicCache` over the interleaved sequence (tokens and pauses) that counts real tokens.

    `get_seq_length` and `crop` speak real tokens, as `generate()` expects of the model's cache;
    `get_query_offset` (what the mask builders read) and `extended_length` give interleaved positions.
    """

    def __init__(self, config: PauseConfig, offloading: bool = False) -> None:
        if not isinstance(config, PauseConfig):
            raise ValueError(f"PauseCache needs the PauseConfig of its model, got {type(config).__name__}")
        super().__init__(config=config.base_config, offloading=offloading)
        self.period = config.period

    def extended_length(self, layer_idx: int = 0) -> int:
        """Cached positions of the interleaved sequence (P per real token)."""
        return super().get_seq_length(layer_idx)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Cached real tokens."""
        return self.extended_length(layer_idx) // self.period

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.extended_length(layer_idx)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove real tokens (negative count, as `DynamicCache.crop`) together with their pauses."""
        super().crop(tokens_to_remove * self.period)


class PauseForCausalLM(PreTrainedModel, GenerationMixin):
    """Causal LM with pause tokens after every real token (see the module docstring)."""

    config_class = PauseConfig
    base_model_prefix = "pause"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"]

    def __init__(self, config: PauseConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.validate_pauses()
        if base_model is None:
            base_model = build_base_model(config.base_config, config._attn_implementation, "pause-token model")
        self.base = base_model
        self.pause_embeddings = nn.Embedding(config.pauses, config.hidden_size)
        self.post_init()
        reference = self.base.model.embed_tokens.weight
        self.pause_embeddings.to(device=reference.device, dtype=reference.dtype)

    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | PretrainedConfig | str,
        pauses: int,
        load_kwargs: dict[str, Any] | None = None,
        **config_kwargs: Any,
    ) -> PauseForCausalLM:
        """A pause-token model around a base decoder: a model object keeps its weights (the pause embeddings
        are new), a hub id / local path is loaded first, a config gives a freshly initialised model."""
        if load_kwargs and not isinstance(base, str):
            raise ValueError("load_kwargs applies only when `base` is a hub id or path")
        if isinstance(base, str):
            base = AutoModelForCausalLM.from_pretrained(base, **(load_kwargs or {}))
        if isinstance(base, PretrainedConfig):
            return cls(PauseConfig.from_base(base, pauses, **config_kwargs))
        if not isinstance(base, PreTrainedModel):
            raise ValueError(f"base must be a model, a config, or a hub id / path, got {type(base).__name__}")
        return wrap_pretrained(cls, PauseConfig.from_base(base.config, pauses, **config_kwargs), base)

    def _init_weights(self, module: nn.Module) -> None:
        if hasattr(self, "base"):
            self.base._init_weights(module)  # the pause embeddings are initialised like token embeddings

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.base.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    @property
    def layers(self) -> nn.ModuleList:
        return self.base.model.layers

    # ----------------------------------------------------------------------------- the interleaved sequence
    def extended_input_ids(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """Real token ids with the pause ids inserted after each: (batch, seq) → (batch, seq · P)."""
        batch, length = input_ids.shape
        pause_ids = torch.tensor(self.config.pause_token_ids, dtype=input_ids.dtype, device=input_ids.device)
        groups = torch.cat([input_ids[..., None], pause_ids.expand(batch, length, -1)], dim=-1)
        return groups.reshape(batch, length * self.config.period)

    def embed_extended_ids(self, extended_ids: torch.LongTensor) -> torch.Tensor:
        """Embeddings of an interleaved id sequence: the base embedding for ids in the vocabulary, the pause
        embeddings for pause ids (the extended vocabulary [0, vocab) ∪ pause ids)."""
        first, vocab = self.config.pause_token_id, self.config.vocab_size
        is_pause = extended_ids >= first
        valid = torch.where(is_pause, extended_ids < first + self.config.pauses, extended_ids >= 0)
        valid &= is_pause | (extended_ids < vocab)
        if not bool(valid.all()):
            raise ValueError(
                f"extended ids must lie in [0, {vocab}) or be pause ids {self.config.pause_token_ids}, "
                f"got {sorted(set(extended_ids[~valid].tolist()))[:8]}"
            )
        real = self.base.model.embed_tokens(extended_ids.masked_fill(is_pause, 0))
        pause = self.pause_embeddings((extended_ids - first).clamp(min=0, max=self.config.pauses - 1))
        return torch.where(is_pause[..., None], pause, real)

    def _interleave_pauses(self, real_embeds: torch.Tensor) -> torch.Tensor:
        """(batch, seq, d) real-token embeddings → (batch, seq · P, d) with the pause embeddings inserted."""
        batch, length, width = real_embeds.shape
        pauses = self.pause_embeddings.weight.to(real_embeds.dtype).expand(batch, length, -1, -1)
        return torch.cat([real_embeds[:, :, None], pauses], dim=2).reshape(batch, length * self.config.period, width)

    # ----------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: PauseCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Causal-LM forward over real tokens (see the module docstring); the pauses are inserted here. A
        cache is used when `past_key_values` is passed (a `PauseCache`) or created when `use_cache=True`."""
        check_no_extra_outputs(kwargs)
        period, base_config = self.config.period, self.base.config
        batch, length = chunk_shape(input_ids, inputs_embeds, self.config.hidden_size, self.config.vocab_size)
        cache = self._resolve_cache(past_key_values, use_cache)
        past = self._cached_real_tokens(cache)
        attention_mask = check_attention_mask(attention_mask, batch, past + length)
        real_embeds = self.base.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = self._interleave_pauses(real_embeds)
        real_positions = chunk_position_ids(attention_mask, position_ids, past, batch, length, hidden.device)
        offsets = torch.arange(period, device=hidden.device)
        positions = (real_positions[..., None] * period + offsets).reshape(batch, length * period)
        extended_mask = None if attention_mask is None else attention_mask.repeat_interleave(period, dim=1)
        masks = attention_masks(base_config, hidden, extended_mask, cache, positions)
        rotary = self.base.model.rotary_emb(hidden, position_ids=positions)
        for block, kind in enumerate(block_attention_kinds(base_config)):
            hidden = self.layers[block](
                hidden,
                attention_mask=masks[kind],
                position_ids=positions,
                past_key_values=cache,
                use_cache=cache is not None,
                position_embeddings=rotary,
            )
        at_last_pause = hidden[:, period - 1 :: period]  # predicts the next real token
        logits = self.base.lm_head(self.base.model.norm(at_last_pause[:, kept_positions(logits_to_keep)]))
        loss = None
        if labels is not None:
            loss = self.base.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    def _resolve_cache(self, past_key_values: Any, use_cache: bool | None) -> PauseCache | None:
        if past_key_values is None:
            return PauseCache(self.config) if use_cache else None
        if use_cache is False:
            raise ValueError("use_cache=False contradicts the past_key_values that was passed")
        if not isinstance(past_key_values, PauseCache) or past_key_values.period != self.config.period:
            raise ValueError(
                f"past_key_values must be a PauseCache built from this model's config (period {self.config.period}: "
                f"each real token and its pauses), got {type(past_key_values).__name__}"
            )
        return past_key_values

    def _cached_real_tokens(self, cache: PauseCache | None) -> int:
        if cache is None:
            return 0
        extended = cache.extended_length()
        if extended % self.config.period:
            raise ValueError(
                f"the cache holds {extended} positions, not a whole number of (token + {self.config.pauses} pauses) "
                "groups: it was filled by another model"
            )
        return extended // self.config.period

    def _prepare_cache_for_generation(
        self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any
    ) -> None:
        """generate() gets a `PauseCache`, whose lengths count real tokens as generate() slices inputs by."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        cache = model_kwargs.get("past_key_values")
        if type(cache) is DynamicCache and not getattr(cache, "_is_user_defined", False):
            model_kwargs["past_key_values"] = PauseCache(self.config, offloading=cache.offloading)
