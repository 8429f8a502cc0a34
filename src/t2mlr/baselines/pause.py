"""Pause-token baseline: every real token is followed by `pauses` learnable pause tokens.

The paper (§4.2, Table "looped_baselines") compares T²MLR with a "pause-token ×2" model after Goyal et
al., "Think before you speak: Training Language Models With Pause Tokens" (arXiv 2310.02226).

How we read Goyal et al. and what we kept:

* A pause token is a learnable embedding added to the vocabulary. The model is never trained to predict
  it: loss terms whose target is a pause token are dropped, and the prediction of the next real token
  is read at the *last* pause before it, so the pauses' computation feeds the prediction.
* Goyal et al. insert pauses at random places during pretraining and append a block of pauses to the
  prompt downstream. The paper's baseline is a fixed compute multiplier ("×2"), so we use the dense,
  deterministic layout: P − 1 = `pauses` pause tokens after *every* real token (the decoder runs P
  tokens per real token: "×P"; the paper's ×2 is `pauses=1`; the command line's `--pause P` and the
  benchmarks' `pause:P` name the multiplier P, the config field `pauses` the count P − 1),

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
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from t2mlr.baselines.decoder_parts import (
    WrappedDecoderConfig,
    WrappedDecoderForCausalLM,
    WrappedDecoderModel,
    check_positive_int,
)
from t2mlr.model.layout import TokenLayout
from t2mlr.settings import PauseSettings

__all__ = ["PauseCache", "PauseConfig", "PauseForCausalLM", "PauseModel", "interleaved_layout"]


class PauseConfig(WrappedDecoderConfig):
    """A base decoder's config plus the pause layout (`t2mlr.settings.PauseSettings`: pauses, pause_token_id)."""

    model_type = "t2mlr_pause"
    wrapper_name = "pause-token model"
    settings = PauseSettings

    def __init__(self, base_config: PretrainedConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        # Declared, though it only passes on: transformers gives a config class without an `__init__` a dataclass one.
        super().__init__(base_config, **kwargs)

    @property
    def period(self) -> int:
        """P: tokens the decoder runs per real token (the token and its pauses)."""
        return self.pauses + 1

    @property
    def pause_token_ids(self) -> list[int]:
        return list(range(self.pause_token_id, self.pause_token_id + self.pauses))

    def check_settings(self) -> None:
        """The pause count, and the first pause id (the base vocabulary size when not given)."""
        check_positive_int("pauses", self.pauses)
        if self.pause_token_id is None:
            self.pause_token_id = self.vocab_size
        first = self.pause_token_id
        if isinstance(first, bool) or not isinstance(first, int) or first < self.vocab_size:
            raise ValueError(
                f"pause_token_id must be an int >= vocab_size={self.vocab_size} (pause ids may not collide with the "
                f"vocabulary [0, {self.vocab_size})), got {first!r}"
            )

    def describe(self) -> str:
        """E.g. "pause tokens ×2 (1 after every token)"."""
        return f"pause tokens ×{self.period} ({self.pauses} after every token)"


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


def interleaved_layout(layout: TokenLayout, period: int) -> TokenLayout:
    """The layout of the real tokens with P − 1 pauses after each: a pause shares its token's padding bit
    and document, and sits at position p·P + j (p its token's position, j = 1 .. P − 1)."""
    batch, length = layout.real.shape
    offsets = torch.arange(period, device=layout.real.device)
    starts = torch.zeros(batch, length, period, dtype=torch.bool, device=layout.real.device)
    starts[..., 0] = layout.document_start
    documents = layout.document_ids
    return TokenLayout(
        position_ids=(layout.position_ids[..., None] * period + offsets).reshape(batch, length * period),
        real=layout.real.repeat_interleave(period, dim=1),
        document_start=starts.reshape(batch, length * period),
        document_ids=None if documents is None else documents.repeat_interleave(period, dim=1),
    )


class PauseModel(WrappedDecoderModel):
    """The pause-token backbone: the pause embeddings and the interleaved forward (module docstring)."""

    config_class = PauseConfig

    def build_own_modules(self) -> list[nn.Module]:
        self.pause_embeddings = nn.Embedding(self.config.pauses, self.config.hidden_size)
        return [self.pause_embeddings]

    def new_cache(self, offloading: bool = False) -> PauseCache:
        return PauseCache(self.config, offloading=offloading)

    def fits_cache(self, cache: Any) -> bool:
        return isinstance(cache, PauseCache) and cache.period == self.config.period

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
        real = self.embed_tokens(extended_ids.masked_fill(is_pause, 0))
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
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """The final-norm hidden states at the last pause after each real token, which predict the next
        real token (see the module docstring); the pauses are inserted here. A cache is used when
        `past_key_values` is passed (a `PauseCache`) or created when `use_cache=True`. Real position p
        becomes p·P .. p·P + P − 1, so real positions must stay below max_position_embeddings // P."""
        period, base_config = self.config.period, self.config.base_config
        max_positions = getattr(base_config, "max_position_embeddings", None)
        cache, layout, attention_mask = self.checked_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache,
            None if max_positions is None else max_positions // period, kwargs,
        )
        self._check_whole_groups(cache)
        hidden = self._interleave_pauses(self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds)
        extended_mask = None if attention_mask is None else attention_mask.repeat_interleave(period, dim=1)
        inputs = self.chunk_inputs(hidden, extended_mask, interleaved_layout(layout, period), cache)
        for block in range(len(self.layers)):
            hidden = self.run_block(block, hidden, inputs)
        at_last_pause = hidden[:, period - 1 :: period]  # predicts the next real token
        return BaseModelOutputWithPast(last_hidden_state=self.norm(at_last_pause), past_key_values=cache)

    def _check_whole_groups(self, cache: PauseCache | None) -> None:
        """A cache filled by this model holds whole groups of a token and its pauses."""
        extended = 0 if cache is None else cache.extended_length()
        if extended % self.config.period:
            raise ValueError(
                f"the cache holds {extended} positions, not a whole number of (token + {self.config.pauses} pauses) "
                "groups: it was filled by another model"
            )


class PauseForCausalLM(WrappedDecoderForCausalLM):
    """Causal LM with pause tokens after every real token (see the module docstring)."""

    config_class = PauseConfig
    backbone_class = PauseModel

    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | PretrainedConfig | str,
        pauses: int = 1,
        load_kwargs: dict[str, Any] | None = None,
        **config_kwargs: Any,
    ) -> PauseForCausalLM:
        """A pause-token model around a base decoder (see `WrappedDecoderForCausalLM.wrap`): a model object
        keeps its weights (the pause embeddings are new), a hub id / local path is loaded first, a config
        gives a freshly initialised model."""
        return cls.wrap(base, load_kwargs, pauses=pauses, **config_kwargs)
