"""`T2MLRForCausalLM`: a Hugging Face decoder with temporal middle-layer recurrence (SPEC §1–5).

The wrapped decoder (`self.base`, e.g. a `LlamaForCausalLM`) keeps its own embeddings, decoder layers,
rotary embeddings, final norm and LM head; this module only decides in which order its blocks run and
inserts the fusion Φ before block l_start and the cache update after block l_end.

One forward, three paths over the middle block l_start..l_end (blocks below and above always run in
parallel over the whole chunk, with the base model's own KV cache when one is passed):

* exact: token by token, R carried from token to token (the definition; also the decode step).
* jacobi: SPEC §5.2 / paper Algorithm 1: a seed pass without fusion, d_forward - 1 fused refinements,
  then the final pass; gradients flow through the last d_backward cache iterates only and the other
  iterations run under no_grad. The middle block runs d_forward + 1 times, everything else once.
* off: the base model unchanged (no fusion, no cache update).

Token bookkeeping (SPEC §4): R is read as 0 at every document start (position_ids restarting at 0,
or explicit `document_ids`), padding passes R through unchanged (it never writes R, and a real token
never reads a pad's state), and attention stays inside each document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, DynamicCache, GenerationMixin, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache import T2MLRCache
from .configuration import T2MLRConfig, check_depths, check_recurrence_path
from .fusion import CacheNorm, GatedFusion


@dataclass
class T2MLRCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the recurrence's own outputs.

    recurrent_state: R after the last token of each row, (batch, hidden); None on the "off" path.
    jacobi_iterations: cache iterates computed by the Jacobi path (fewer than d_forward when the
        early stop fired); None on the other paths.
    """

    recurrent_state: torch.Tensor | None = None
    jacobi_iterations: int | None = None


@dataclass
class TokenLayout:
    """Per-token facts of one chunk that the recurrence and the attention masks need."""

    position_ids: torch.Tensor  # (batch, chunk)
    real: torch.Tensor  # (batch, chunk) bool: not padding
    document_start: torch.Tensor  # (batch, chunk) bool: R is read as 0 here
    document_ids: torch.Tensor | None  # (batch, chunk) when some row packs several documents


@dataclass
class LayerInputs:
    """What every decoder layer call of one chunk shares."""

    masks: list[Any]  # per layer: 4D mask, 2D mask or None, as transformers builds it
    position_ids: torch.Tensor
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    cache: T2MLRCache | None


def _same_document(document_ids: torch.Tensor) -> Callable[[Any, Any, Any, Any], Any]:
    """Mask function for transformers' mask builders: a query sees only keys of its own document."""

    def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        return document_ids[batch_idx, q_idx] == document_ids[batch_idx, kv_idx]

    return inner


def _layer_attention_kinds(base_config: Any) -> list[str]:
    """Which mask each layer needs: "full_attention" or "sliding_attention" (Mistral, Qwen2 windows)."""
    layer_types = getattr(base_config, "layer_types", None)
    if layer_types is not None:
        return list(layer_types)
    sliding = getattr(base_config, "sliding_window", None)
    kind = "sliding_attention" if sliding is not None else "full_attention"
    return [kind] * base_config.num_hidden_layers


def _latest_real_index(real: torch.Tensor) -> torch.Tensor:
    """For each token, the index of the latest real (non-pad) token at or before it, or -1."""
    index = torch.arange(real.shape[1], device=real.device).expand_as(real)
    return torch.where(real, index, torch.full_like(index, -1)).cummax(dim=1).values


def _gather_states(states: torch.Tensor, first: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """states[:, source[t]] per token, with source -1 meaning `first` (the chunk's incoming R)."""
    padded = torch.cat([first[:, None], states], dim=1)
    return padded.gather(1, (source + 1)[..., None].expand(-1, -1, states.shape[-1]))


def _shift_right(states: torch.Tensor, first: torch.Tensor, latest_real: torch.Tensor) -> torch.Tensor:
    """The state each token reads: the state after the latest real token before it (`first` if none).

    Without padding this is ShiftRight of the paper's Algorithm 1. Reading from the latest real token
    lets R cross any run of padding within one Jacobi iteration, as it does in the exact path.
    """
    previous = torch.cat([torch.full_like(latest_real[:, :1], -1), latest_real[:, :-1]], dim=1)
    return _gather_states(states, first, previous)


class T2MLRPreTrainedModel(PreTrainedModel):
    config_class = T2MLRConfig
    base_model_prefix = "t2mlr"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"]


class T2MLRForCausalLM(T2MLRPreTrainedModel, GenerationMixin):
    """T²MLR causal LM. See the module docstring for the forward paths."""

    def __init__(self, config: T2MLRConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.validate_recurrence()
        if base_model is None:
            base_model = AutoModelForCausalLM.from_config(
                config.base_config, attn_implementation=config._attn_implementation
            )
        self.base = base_model
        self._check_wrappable()
        d = config.hidden_size
        eps = getattr(config.base_config, "rms_norm_eps", 1e-6)
        self.fusion = GatedFusion(d)
        self.cache_norm = CacheNorm(d, eps) if config.cache_residual else None
        self.post_init()
        self._match_base_placement()

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | str,
        l_start: int,
        l_end: int,
        load_kwargs: dict[str, Any] | None = None,
        **config_kwargs: Any,
    ) -> "T2MLRForCausalLM":
        """Retrofit a pretrained decoder (model object, hub id or local path) into T²MLR.

        The base weights are kept as they are; the fusion starts closed (γ = 0), so the new model's
        logits equal the base model's until training opens the gates.
        """
        if isinstance(base, str):
            base = AutoModelForCausalLM.from_pretrained(base, **(load_kwargs or {}))
        elif load_kwargs:
            raise ValueError("load_kwargs applies only when `base` is a hub id or path")
        config = T2MLRConfig.from_base(base.config, l_start=l_start, l_end=l_end, **config_kwargs)
        state = {k: v.detach().clone() for k, v in base.state_dict().items()}
        model = cls(config, base_model=base)
        model.base.load_state_dict(state)  # undo any re-initialisation post_init may have applied
        return model

    def _check_wrappable(self) -> None:
        inner = getattr(self.base, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, name) for name in needed) or not hasattr(self.base, "lm_head"):
            raise ValueError(
                f"cannot wrap {type(self.base).__name__}: T²MLR needs a *ForCausalLM with .model.embed_tokens, "
                ".model.layers, .model.norm, .model.rotary_emb and .lm_head (Llama, Mistral, Qwen2, Qwen3)"
            )

    def _match_base_placement(self) -> None:
        """New modules follow the base model's device and dtype (γ stays float32, see GatedFusion)."""
        reference = self.base.model.embed_tokens.weight
        for module in (self.fusion, self.cache_norm):
            if module is not None:
                module.to(device=reference.device, dtype=reference.dtype)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, GatedFusion):
            std = getattr(self.config.base_config, "initializer_range", 0.02) * self.config.gate_init_scale
            module.reset_parameters(std)
        elif isinstance(module, CacheNorm):
            nn.init.ones_(module.weight)
        elif hasattr(self, "base"):
            self.base._init_weights(module)

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.base.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    # ----------------------------------------------------------------------------- public helpers
    @property
    def layers(self) -> nn.ModuleList:
        return self.base.model.layers

    def middle_layer_indices(self) -> range:
        """0-based indices of blocks l_start..l_end (1-based in the config)."""
        return range(self.config.l_start - 1, self.config.l_end)

    def middle_layers(self) -> list[nn.Module]:
        return [self.layers[i] for i in self.middle_layer_indices()]

    def set_middle_checkpointing(self, enabled: bool) -> None:
        """Activation checkpointing of the middle block only: it runs d_forward + 1 times per step, so it
        holds most of the activations that gradients need; the other blocks run once."""
        for layer in self.middle_layers():
            layer.gradient_checkpointing = enabled
            layer._gradient_checkpointing_func = lambda fn, *args: checkpoint(fn, *args, use_reentrant=False)

    def resolve_recurrence(self, recurrence: str | None) -> str:
        """The path a call uses: the explicit argument, else the config's training or evaluation path."""
        if recurrence is None:
            recurrence = self.config.train_recurrence if self.training else self.config.eval_recurrence
        check_recurrence_path(recurrence)
        return recurrence

    # ----------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: T2MLRCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        recurrence: str | None = None,
        d_forward: int | None = None,
        d_backward: int | None = None,
        jacobi_tol: float | None = None,
        recurrence_mask: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> T2MLRCausalLMOutput:
        """Causal-LM forward. `recurrence` picks the path ("exact", "jacobi", "off"; None = the config's
        path for the current train/eval mode); `d_forward`/`d_backward` override the Jacobi depths for
        this call; `jacobi_tol` stops the detached Jacobi iterations once max |ΔR| <= tol. Labels are
        standard causal-LM labels (shifted inside, -100 ignored)."""
        path = self.resolve_recurrence(recurrence)
        d_forward = self.config.d_forward if d_forward is None else d_forward
        d_backward = self.config.d_backward if d_backward is None else d_backward
        if path == "jacobi":
            check_depths(d_forward, d_backward)
        if jacobi_tol is not None and not jacobi_tol >= 0:
            raise ValueError(f"jacobi_tol must be >= 0 or None, got {jacobi_tol!r}")

        batch, length, device = self._input_shape(input_ids, inputs_embeds)
        cache = self._resolve_cache(past_key_values, use_cache)
        past = cache.get_seq_length() if cache is not None else 0
        attention_mask = self._check_attention_mask(attention_mask, batch, past + length)
        layout = self._token_layout(attention_mask, position_ids, document_ids, past, batch, length, device)
        self._check_ranges(input_ids, layout.position_ids)
        hidden = inputs_embeds if input_ids is None else self.base.model.embed_tokens(input_ids)
        recurrence_mask = self._check_recurrence_mask(recurrence_mask, batch, length)
        inputs = self._layer_inputs(hidden, attention_mask, layout, cache)

        l_start, l_end = self.config.l_start, self.config.l_end
        hidden = self._run_layers(range(0, l_start - 1), hidden, inputs)
        states, iterations = None, None
        if path == "off":
            hidden = self._run_layers(self.middle_layer_indices(), hidden, inputs)
        else:
            first = self._incoming_state(cache, past, batch, hidden)
            if path == "exact" or length == 1:  # one token: the Jacobi fixed point is reached at once
                hidden, states = self._exact_middle(hidden, first, inputs, layout, recurrence_mask)
            else:
                if past > 0:
                    raise ValueError(
                        "Jacobi over a multi-token chunk needs an empty cache (it is a prefill); continue a "
                        "cached sequence with recurrence='exact' or one token at a time"
                    )
                hidden, states, iterations = self._jacobi_middle(
                    hidden, first, inputs, layout, recurrence_mask, d_forward, d_backward, jacobi_tol
                )
            if cache is not None:
                cache.append_recurrent_states(states)
        hidden = self._run_layers(range(l_end, self.config.num_layers), hidden, inputs)
        hidden = self.base.model.norm(hidden)

        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.base.lm_head(hidden[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.base.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return T2MLRCausalLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=cache,
            recurrent_state=None if states is None else _last_state(states),
            jacobi_iterations=iterations,
        )

    # ----------------------------------------------------------------------------- input checks
    def _input_shape(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None
    ) -> tuple[int, int, torch.device]:
        """Batch, length and device of the chunk, after checking the inputs' types and shapes."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is not None:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size:
                raise ValueError(
                    f"inputs_embeds must have shape (batch, seq, {self.config.hidden_size}), got {tuple(inputs_embeds.shape)}"
                )
            return inputs_embeds.shape[0], inputs_embeds.shape[1], inputs_embeds.device
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"input_ids must be an integer tensor of token ids, got dtype {input_ids.dtype}")
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must have shape (batch, seq) with seq >= 1, got {tuple(input_ids.shape)}")
        return input_ids.shape[0], input_ids.shape[1], input_ids.device

    def _check_ranges(self, input_ids: torch.Tensor | None, position_ids: torch.Tensor) -> None:
        """Token ids inside the vocabulary and positions below the base model's limit, read back in one
        host sync (each sync stalls a GPU decode step; an out-of-range id would otherwise reach the
        embedding and fail there as an opaque device-side assert)."""
        limit = getattr(self.config.base_config, "max_position_embeddings", None)
        bounds = [position_ids.max().reshape(1)]
        if input_ids is not None:
            bounds.append(torch.stack(torch.aminmax(input_ids)).to(position_ids.dtype))
        highest_position, *id_range = torch.cat(bounds).tolist()
        if id_range and (id_range[0] < 0 or id_range[1] >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got range [{id_range[0]}, {id_range[1]}]")
        if limit is not None and highest_position >= limit:
            raise ValueError(
                f"position {highest_position} exceeds the base model's limit (max_position_embeddings={limit}); "
                "shorten the sequence or pack it into documents"
            )

    @staticmethod
    def _resolve_cache(past_key_values: Any, use_cache: bool | None) -> T2MLRCache | None:
        if past_key_values is None:
            return None
        if not isinstance(past_key_values, T2MLRCache):
            raise ValueError(
                f"past_key_values must be a T2MLRCache (it carries the recurrent state), got {type(past_key_values).__name__}"
            )
        if use_cache is False:
            raise ValueError("use_cache=False contradicts the past_key_values that was passed")
        return past_key_values

    @staticmethod
    def _check_attention_mask(mask: torch.Tensor | None, batch: int, total: int) -> torch.Tensor | None:
        if mask is None:
            return None
        if mask.dim() != 2 or tuple(mask.shape) != (batch, total):
            raise ValueError(
                f"attention_mask must be 2D (batch, past + seq) = ({batch}, {total}), got {tuple(mask.shape)}"
            )
        return mask

    def _check_recurrence_mask(self, mask: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
        policy = self.config.recurrence_mask_policy
        if policy == "all":
            if mask is not None:
                raise ValueError("recurrence_mask was passed but recurrence_mask_policy='all'; set the policy to 'mask'")
            return None
        if mask is None:
            raise ValueError("recurrence_mask_policy='mask' needs a recurrence_mask (batch, seq) for every forward")
        if tuple(mask.shape) != (batch, length):
            raise ValueError(f"recurrence_mask must have shape ({batch}, {length}), got {tuple(mask.shape)}")
        return mask.bool()

    # ----------------------------------------------------------------------------- bookkeeping
    @staticmethod
    def _token_layout(
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        past: int,
        batch: int,
        length: int,
        device: torch.device,
    ) -> TokenLayout:
        """Positions, padding and document starts of the chunk (SPEC §4)."""
        if attention_mask is not None:
            real = attention_mask[:, -length:].to(device=device, dtype=torch.bool)
        else:
            real = torch.ones(batch, length, dtype=torch.bool, device=device)
        if document_ids is not None:
            if past > 0:
                raise ValueError("document_ids can only be given for a sequence processed from its start (no cache)")
            if tuple(document_ids.shape) != (batch, length):
                raise ValueError(f"document_ids must have shape ({batch}, {length}), got {tuple(document_ids.shape)}")
            changed = torch.ones_like(real)
            changed[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
            if position_ids is None:
                position_ids = _positions_within_documents(changed)
            starts = changed
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
            else:
                position_ids = torch.arange(past, past + length, device=device).expand(batch, length)
        position_ids = position_ids.to(device).expand(batch, length)
        if document_ids is None:
            starts = position_ids == 0
        starts = starts & real
        packed = length > 1 and _starts_a_later_document(starts, real)  # a one-token step never does (no sync)
        if packed and past > 0:
            raise ValueError("a new document (position 0) cannot start inside a chunk that continues a cache")
        return TokenLayout(
            position_ids=position_ids,
            real=real,
            document_start=starts,
            document_ids=starts.long().cumsum(-1) if packed else None,
        )

    def _layer_inputs(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, layout: TokenLayout, cache: T2MLRCache | None
    ) -> LayerInputs:
        base_config = self.config.base_config
        extra = {}
        if layout.document_ids is not None:
            extra["and_mask_function"] = _same_document(layout.document_ids)
            if attention_mask is None:  # an explicit mask turns off transformers' own packing detection,
                attention_mask = layout.real.long()  # which remaps indices that our mask function reads
        built: dict[str, Any] = {}
        kinds = _layer_attention_kinds(base_config)
        for kind in sorted(set(kinds)):
            builder = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            built[kind] = builder(
                config=base_config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                past_key_values=cache,
                position_ids=layout.position_ids,
                **extra,
            )
        rotary = self.base.model.rotary_emb(hidden, position_ids=layout.position_ids)
        return LayerInputs(
            masks=[built[kind] for kind in kinds],
            position_ids=layout.position_ids,
            position_embeddings=rotary,
            cache=cache,
        )

    def _incoming_state(self, cache: T2MLRCache | None, past: int, batch: int, like: torch.Tensor) -> torch.Tensor:
        """R read by the chunk's first token: the cache's last state, or R_0 = 0 for a new sequence."""
        if past == 0:
            return like.new_zeros(batch, self.config.hidden_size)
        stored = cache.recurrent_states
        if stored is None or stored.shape[1] != past:
            have = 0 if stored is None else stored.shape[1]
            raise ValueError(
                f"the cache holds keys for {past} tokens but recurrent states for {have}: it was filled with "
                "recurrence='off' or by another model; rebuild it with this model's exact or Jacobi path"
            )
        return stored[:, -1].to(like.dtype)

    # ----------------------------------------------------------------------------- building blocks
    def _run_layers(self, indices: Sequence[int], hidden: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        for i in indices:
            hidden = self.layers[i](
                hidden,
                attention_mask=inputs.masks[i],
                position_ids=inputs.position_ids,
                past_key_values=inputs.cache,
                use_cache=inputs.cache is not None,
                position_embeddings=inputs.position_embeddings,
            )
        return hidden

    def _fuse(self, h: torch.Tensor, r: torch.Tensor, recurrence_mask: torch.Tensor | None) -> torch.Tensor:
        fused = self.fusion(h, r)
        if recurrence_mask is None:
            return fused
        return torch.where(recurrence_mask[..., None], fused, h)

    def _next_state(self, h_end: torch.Tensor, r_read: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """R after a token: the cache update for real tokens; padding passes R through unchanged."""
        updated = self.cache_norm(h_end + r_read) if self.cache_norm is not None else h_end
        return torch.where(real[..., None], updated, r_read)

    @staticmethod
    def _read_state(state: torch.Tensor, document_start: torch.Tensor) -> torch.Tensor:
        """R as read by a token: zero at a document start."""
        return state.masked_fill(document_start[..., None], 0.0)

    # ----------------------------------------------------------------------------- exact path
    def _exact_middle(
        self,
        h_low: torch.Tensor,
        first: torch.Tensor,
        inputs: LayerInputs,
        layout: TokenLayout,
        recurrence_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks l_start..l_end token by token with a KV cache; returns their outputs and R after each token."""
        cache = inputs.cache if inputs.cache is not None else DynamicCache()
        decode_step = h_low.shape[1] == 1  # the chunk's own masks are already the step's masks
        middle = self.middle_layer_indices()
        layers = {i: self.layers[i] for i in middle}
        chunk_offsets = {} if decode_step else {i: self._chunk_kv_offset(inputs.cache, i) for i in middle}
        cos, sin = inputs.position_embeddings
        outputs, states = [], []
        state = first
        for t in range(h_low.shape[1]):
            r_read = self._read_state(state, layout.document_start[:, t])
            step_mask = None if recurrence_mask is None else recurrence_mask[:, t : t + 1]
            hidden = self._fuse(h_low[:, t : t + 1], r_read[:, None], step_mask)
            for i in middle:
                hidden = layers[i](
                    hidden,
                    attention_mask=inputs.masks[i]
                    if decode_step
                    else self._step_mask(inputs.masks[i], t, cache, i, chunk_offsets[i]),
                    position_ids=inputs.position_ids[:, t : t + 1],
                    past_key_values=cache,
                    use_cache=True,
                    position_embeddings=(cos[:, t : t + 1], sin[:, t : t + 1]),
                )
            state = self._next_state(hidden[:, 0], r_read, layout.real[:, t])
            outputs.append(hidden)
            states.append(state)
        return torch.cat(outputs, dim=1), torch.stack(states, dim=1)

    @staticmethod
    def _chunk_kv_offset(cache: T2MLRCache | None, layer_idx: int) -> int:
        """Absolute index of the first key column of the chunk's mask for this layer."""
        return 0 if cache is None else cache.get_mask_sizes(1, layer_idx)[1]

    @staticmethod
    def _step_mask(mask: Any, t: int, cache: DynamicCache, layer_idx: int, chunk_offset: int) -> Any:
        """Row t of the chunk's mask, cut to the keys the layer's cache will hold at that step."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            raise ValueError(
                "the exact path needs 'eager' or 'sdpa' attention (4D masks); this model uses "
                f"{type(mask).__name__} masks: switch attn_implementation, or use recurrence='jacobi'"
            )
        kv_length, kv_offset = cache.get_mask_sizes(1, layer_idx) if len(cache.layers) > layer_idx else (t + 1, 0)
        start = kv_offset - chunk_offset
        return mask[:, :, t : t + 1, start : start + kv_length]

    # ----------------------------------------------------------------------------- Jacobi path
    def _jacobi_middle(
        self,
        h_low: torch.Tensor,
        first: torch.Tensor,
        inputs: LayerInputs,
        layout: TokenLayout,
        recurrence_mask: torch.Tensor | None,
        d_forward: int,
        d_backward: int,
        tol: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """SPEC §5.2: cache iterates R<1>..R<d_forward>, then the final (cached) pass of the middle block.

        Iterate k comes from the middle block's output H<k-1> (H<0>: no fusion). Iterates k <= d_forward -
        d_backward are computed under no_grad; with `tol`, those detached iterations stop early once
        max |R<k> - R<k-1>| <= tol. The iterations that carry gradients always run.
        """
        no_cache = LayerInputs(inputs.masks, inputs.position_ids, inputs.position_embeddings, cache=None)
        middle = self.middle_layer_indices()
        latest_real = _latest_real_index(layout.real)
        r_read = self._read_state(_shift_right(torch.zeros_like(h_low), first, latest_real), layout.document_start)
        grad_from = d_forward - d_backward + 1
        iterations, moved = 0, float("inf")
        for k in range(1, d_forward + 1):
            carries_grad = k >= grad_from
            if not carries_grad and tol is not None and iterations >= 2 and moved <= tol:
                continue  # converged: skip to the iterations that carry gradients
            with torch.set_grad_enabled(carries_grad and torch.is_grad_enabled()):
                fused = h_low if k == 1 else self._fuse(h_low, r_read, recurrence_mask)
                h_end = self._run_layers(middle, fused, no_cache)
                after = self._next_state(h_end, r_read, layout.real)
                new_read = self._read_state(_shift_right(after, first, latest_real), layout.document_start)
            if not carries_grad and tol is not None:
                moved = float((new_read - r_read).abs().max())
            r_read = new_read
            iterations += 1
        fused = self._fuse(h_low, r_read, recurrence_mask)
        h_end = self._run_layers(middle, fused, inputs)
        after = self._next_state(h_end, r_read, layout.real)
        return h_end, _gather_states(after, first, latest_real), iterations

    # ----------------------------------------------------------------------------- generation
    def _prepare_cache_for_generation(self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any):
        """generate() gets a T2MLRCache, so R is reordered, expanded and cropped with the KV cache."""
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            model_kwargs["past_key_values"] = T2MLRCache(config=self.config.base_config)
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, *args: Any, recurrence_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Per-step inputs: after the prompt, chunks continue a cache and run the exact path (one token
        per step, or the token-by-token verification of assisted decoding); with
        recurrence_mask_policy="mask", `recurrence_mask` covers the prompt and generated tokens recur."""
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        cache = inputs.get("past_key_values")
        past = cache.get_seq_length() if cache is not None else 0
        if past > 0 and self.resolve_recurrence(inputs.get("recurrence")) == "jacobi":
            inputs["recurrence"] = "exact"
        if self.config.recurrence_mask_policy == "mask":
            inputs["recurrence_mask"] = self._generation_recurrence_mask(
                recurrence_mask, input_ids.shape, past, inputs["input_ids"].shape[1]
            )
        elif recurrence_mask is not None:
            inputs["recurrence_mask"] = recurrence_mask  # forward raises its policy error
        return inputs

    @staticmethod
    def _generation_recurrence_mask(
        prompt_mask: torch.Tensor | None, full_shape: torch.Size, past: int, chunk: int
    ) -> torch.Tensor:
        """The chunk's slice of [prompt mask, True for every generated token]."""
        if prompt_mask is None:
            raise ValueError(
                "recurrence_mask_policy='mask': pass generate(..., recurrence_mask=MASK) for the prompt "
                "(batch, prompt length); generated tokens always recur"
            )
        batch, total = full_shape
        if prompt_mask.shape[0] != batch or prompt_mask.shape[1] > total:
            raise ValueError(f"recurrence_mask must have shape (batch, prompt length), got {tuple(prompt_mask.shape)}")
        generated = torch.ones(batch, total - prompt_mask.shape[1], dtype=torch.bool, device=prompt_mask.device)
        return torch.cat([prompt_mask.bool(), generated], dim=1)[:, past : past + chunk]

    def generate(
        self,
        *args: Any,
        prefill: str | None = None,
        prefill_depth: int | None = None,
        prefill_tol: float | None = None,
        **kwargs: Any,
    ):
        """`GenerationMixin.generate` plus the prompt's forward path.

        prefill="exact" (default: the config's eval path) runs the prompt's middle block token by token;
        prefill="jacobi" runs it in parallel with `prefill_depth` cache iterations (default: the config's
        d_forward), approximate unless prefill_depth >= prompt length; `prefill_tol` stops those
        iterations early once max |ΔR| <= tol (a trained model's cache often converges in a few, so a
        generous depth with a tolerance costs only what the prompt needs). Every later chunk continues
        the cache on the exact path: one token per step (where both paths coincide), or token by token
        for the verification chunks of assisted decoding. With recurrence_mask_policy="mask", pass
        `recurrence_mask` for the prompt; generated tokens recur.
        """
        if prefill != "jacobi" and (prefill_depth is not None or prefill_tol is not None):
            raise ValueError("prefill_depth and prefill_tol apply to prefill='jacobi' only")
        if prefill is not None:
            if prefill not in ("exact", "jacobi"):
                raise ValueError(f"prefill must be 'exact' or 'jacobi', got {prefill!r}")
            kwargs["recurrence"] = prefill
        if prefill == "jacobi":
            depth = self.config.d_forward if prefill_depth is None else prefill_depth
            check_depths(depth, 1)
            if prefill_tol is not None and not prefill_tol >= 0:
                raise ValueError(f"prefill_tol must be >= 0, got {prefill_tol!r}")
            kwargs["d_forward"], kwargs["d_backward"], kwargs["jacobi_tol"] = depth, 1, prefill_tol
        return super().generate(*args, **kwargs)


def _last_state(states: torch.Tensor) -> torch.Tensor:
    """R after the chunk's last token; a copy when it carries gradients, since FSDP2 hooks a module's
    outputs and warns that in-place changes to a view would bypass them."""
    last = states[:, -1]
    return last.clone() if last.requires_grad else last


def _starts_a_later_document(starts: torch.Tensor, real: torch.Tensor) -> bool:
    """Whether a row holds a document start after its first real token (a packed chunk); one host sync."""
    first_real = real.long().cumsum(-1) == 1
    return bool((starts[:, 1:] & ~first_real[:, 1:]).any())


def _positions_within_documents(starts: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... restarting at every True of `starts` (batch, seq)."""
    index = torch.arange(starts.shape[1], device=starts.device).expand_as(starts)
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start
