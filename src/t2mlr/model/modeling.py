"""`T2MLRForCausalLM`: a Hugging Face decoder with temporal middle-layer recurrence.

The wrapped decoder (`self.base`, e.g. a `LlamaForCausalLM`) keeps its own embeddings, decoder layers,
rotary embeddings, final norm and LM head. This module decides in which order its blocks run and
inserts the fusion Φ before block l_start and the cache update after block l_end (docs/semantics.md).

A forward reads prefix → middle → suffix. The prefix (blocks below l_start) and the suffix (blocks
above l_end, norm, head) run once, in parallel over the chunk. The middle block l_start..l_end runs on
one of three paths:

* exact: token by token, R carried from token to token (the definition; also the decode step).
* jacobi: a seed pass without fusion, then fused refinements of the whole chunk's R at once, then a
  final pass; the detached iterations run in a no-grad loop, the last d_backward in a gradient loop.
  The middle block runs d_forward + 1 times, everything else once.
* off: the base model unchanged (no fusion, no cache update).

R has one name per role: `r_in` is R before the chunk (from the cache, or R_0 = 0), `r_read` is what
each token reads (R_{t-1}, zero at a document start), `r_out` is what each token writes (R_t).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from t2mlr.utils import check_known_names

from . import checks
from .cache import T2MLRCache
from .configuration import ForwardPath, T2MLRConfig
from .fusion import CacheNorm, GatedFusion
from .generation import T2MLRGenerationMixin
from .layout import (
    LayerInputs,
    TokenLayout,
    chunk_kv_offset,
    gather_states,
    latest_real_index,
    layer_inputs,
    reset_at_starts,
    states_read,
    step_mask,
)
from .remote_code import write_remote_code_modules
from .wrapping import WrapsBaseDecoder, checkpoint_blocks, follow_base_placement, wrapped_base


@dataclass
class T2MLRCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the recurrence's own outputs.

    recurrent_state: R after the last token of each row, (batch, hidden); None on the "off" path.
    jacobi_iterations: cache iterates computed by the Jacobi path (fewer than d_forward when the
        early stop fired); None on the other paths.
    """

    recurrent_state: torch.Tensor | None = None
    jacobi_iterations: int | None = None


class T2MLRPreTrainedModel(WrapsBaseDecoder, PreTrainedModel):
    config_class = T2MLRConfig
    base_model_prefix = "t2mlr"


def is_t2mlr(model: nn.Module) -> bool:
    """The one test of "is this a T²MLR model" (a wrapper such as DDP must be unwrapped first)."""
    return isinstance(model, T2MLRForCausalLM)


class T2MLRForCausalLM(T2MLRPreTrainedModel, T2MLRGenerationMixin):
    """T²MLR causal LM. See the module docstring for the forward paths."""

    def __init__(self, config: T2MLRConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.validate_recurrence()
        self.base = wrapped_base(config.base_config, config._attn_implementation, base_model, "T²MLR")
        d = config.hidden_size
        self.fusion = GatedFusion(d)
        self.cache_norm = CacheNorm(d, getattr(config.base_config, "rms_norm_eps", 1e-6)) if config.cache_residual else None
        self.post_init()
        follow_base_placement(self.base, (self.fusion, self.cache_norm))

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

        The fusion starts closed (γ = 0), so the new model's logits equal the base model's until
        training opens the gates. A model object is wrapped, not copied: its modules become this
        model's (no second copy of the weights), so training the retrofit changes them; pass
        `copy.deepcopy(base)` to keep the original. `config_kwargs` are recurrence fields only.
        """
        check_known_names(config_kwargs, T2MLRConfig.recurrence_fields(), "T2MLRConfig field")
        if isinstance(base, str):
            base = AutoModelForCausalLM.from_pretrained(base, **(load_kwargs or {}))
        elif load_kwargs:
            raise ValueError("load_kwargs applies only when `base` is a hub id or path")
        config = T2MLRConfig.from_base(base.config, l_start=l_start, l_end=l_end, **config_kwargs)
        return cls(config, base_model=base)

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, plus the modules that let the directory load without
        `import t2mlr` (`trust_remote_code=True`; see `t2mlr.model.remote_code`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code_modules(save_directory)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, GatedFusion):
            std = getattr(self.config.base_config, "initializer_range", 0.02) * self.config.gate_init_scale
            module.reset_parameters(std)
        elif isinstance(module, CacheNorm):
            nn.init.ones_(module.weight)
        else:
            super()._init_weights(module)

    # ----------------------------------------------------------------------------- the three parts
    def middle_layer_indices(self) -> range:
        """0-based indices of blocks l_start..l_end (1-based in the config)."""
        return range(self.config.l_start - 1, self.config.l_end)

    def prefix_layer_indices(self) -> range:
        return range(0, self.config.l_start - 1)

    def suffix_layer_indices(self) -> range:
        return range(self.config.l_end, self.config.num_layers)

    def set_middle_checkpointing(self, enabled: bool) -> None:
        """Activation checkpointing of the middle block only: it runs d_forward + 1 times per step, so it
        holds most of the activations that gradients need; the other blocks run once."""
        checkpoint_blocks(self.layers, self.middle_layer_indices(), enabled)

    def forward_path(self, recurrence: str | None = None, **overrides: Any) -> ForwardPath:
        """The path a call with these arguments takes in the current train/eval mode (see T2MLRConfig)."""
        return self.config.forward_path(self.training, recurrence, **overrides)

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
        path for the current train/eval mode); `d_forward`, `d_backward` and `jacobi_tol` override the
        config's Jacobi settings for this call (unused on the other paths). Labels are standard
        causal-LM labels (shifted inside, -100 ignored)."""
        path = self.forward_path(recurrence, d_forward=d_forward, d_backward=d_backward, jacobi_tol=jacobi_tol)
        cache = checks.checked_cache(past_key_values, use_cache)
        past = cache.get_seq_length() if cache is not None else 0
        layout, attention_mask = checks.checked_chunk(
            input_ids, inputs_embeds, attention_mask, position_ids, labels, cache, self.config.hidden_size,
            self.config.vocab_size, getattr(self.config.base_config, "max_position_embeddings", None), document_ids,
        )
        batch, length = layout.real.shape
        recurrence_mask = checks.checked_recurrence_mask(recurrence_mask, self.config.recurrence_mask_policy, batch, length)
        hidden = inputs_embeds if input_ids is None else self.base.model.embed_tokens(input_ids)
        inputs = layer_inputs(self.config.base_config, self.base.model.rotary_emb, hidden, attention_mask, layout, cache)

        hidden = self._run_layers(self.prefix_layer_indices(), hidden, inputs)
        hidden, r_out, iterations = self._middle(path, hidden, inputs, layout, recurrence_mask, past)
        hidden = self._run_layers(self.suffix_layer_indices(), hidden, inputs)
        logits, loss = self.head_and_loss(hidden, labels, logits_to_keep, **kwargs)
        return T2MLRCausalLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=cache,
            recurrent_state=None if r_out is None else _last_state(r_out),
            jacobi_iterations=iterations,
        )

    def _run_layers(self, indices: Sequence[int], hidden: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        for i in indices:
            hidden = self.run_block(i, hidden, inputs)
        return hidden

    def _middle(
        self,
        path: ForwardPath,
        h_low: torch.Tensor,
        inputs: LayerInputs,
        layout: TokenLayout,
        recurrence_mask: torch.Tensor | None,
        past: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None, int | None]:
        """Blocks l_start..l_end on the chosen path: their output, R after each token, Jacobi iterates."""
        if path.recurrence == "off":
            return self._run_layers(self.middle_layer_indices(), h_low, inputs), None, None
        cache = inputs.cache
        if past == 0:
            r_in = h_low.new_zeros(h_low.shape[0], self.config.hidden_size)
        else:
            r_in = checks.checked_incoming_state(cache, past).to(h_low.dtype)
        iterations = None
        if path.recurrence == "exact" or h_low.shape[1] == 1:  # one token: the Jacobi fixed point at once
            h_end, r_out = self._exact_middle(h_low, r_in, inputs, layout, recurrence_mask)
        elif past > 0:
            raise ValueError(
                "Jacobi over a multi-token chunk needs an empty cache (it is a prefill); continue a "
                "cached sequence with recurrence='exact' or one token at a time"
            )
        else:
            h_end, r_out, iterations = self._jacobi_middle(h_low, r_in, inputs, layout, recurrence_mask, path)
        if cache is not None:
            cache.append_recurrent_states(r_out)
        return h_end, r_out, iterations

    # ----------------------------------------------------------------------------- fusion and update
    def _fuse(self, h: torch.Tensor, r_read: torch.Tensor, recurrence_mask: torch.Tensor | None) -> torch.Tensor:
        fused = self.fusion(h, r_read)
        if recurrence_mask is None:
            return fused
        return torch.where(recurrence_mask[..., None], fused, h)

    def _write_state(self, h_end: torch.Tensor, r_read: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """R after a token: the cache update for real tokens; padding passes R through unchanged."""
        updated = self.cache_norm(h_end + r_read) if self.cache_norm is not None else h_end
        return torch.where(real[..., None], updated, r_read)

    # ----------------------------------------------------------------------------- exact path
    def _exact_middle(
        self,
        h_low: torch.Tensor,
        r_in: torch.Tensor,
        inputs: LayerInputs,
        layout: TokenLayout,
        recurrence_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The middle block token by token with a KV cache; returns its outputs and R after each token."""
        cache = inputs.cache if inputs.cache is not None else DynamicCache()
        decode_step = h_low.shape[1] == 1  # the chunk's own masks are already the step's masks
        middle = self.middle_layer_indices()
        offsets = {} if decode_step else {i: chunk_kv_offset(inputs.cache, i) for i in middle}
        cos, sin = inputs.position_embeddings
        outputs, r_out = [], []
        r_prev = r_in
        for t in range(h_low.shape[1]):
            r_read = reset_at_starts(r_prev, layout.document_start[:, t])
            token_mask = None if recurrence_mask is None else recurrence_mask[:, t : t + 1]
            hidden = self._fuse(h_low[:, t : t + 1], r_read[:, None], token_mask)
            for i in middle:
                hidden = self.layers[i](
                    hidden,
                    attention_mask=inputs.masks[i] if decode_step else step_mask(inputs.masks[i], t, cache, i, offsets[i]),
                    position_ids=inputs.position_ids[:, t : t + 1],
                    past_key_values=cache,
                    use_cache=True,
                    position_embeddings=(cos[:, t : t + 1], sin[:, t : t + 1]),
                )
            r_prev = self._write_state(hidden[:, 0], r_read, layout.real[:, t])
            outputs.append(hidden)
            r_out.append(r_prev)
        return torch.cat(outputs, dim=1), torch.stack(r_out, dim=1)

    # ----------------------------------------------------------------------------- Jacobi path
    def _jacobi_middle(
        self,
        h_low: torch.Tensor,
        r_in: torch.Tensor,
        inputs: LayerInputs,
        layout: TokenLayout,
        recurrence_mask: torch.Tensor | None,
        path: ForwardPath,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Cache iterates R<1>..R<d_forward>, then the final (cached) pass of the middle block.

        Iterate k comes from the middle block's output H<k-1> (H<0>: the seed pass, no fusion). The first
        d_forward - d_backward iterates are computed in a no-grad loop, which stops early once
        max |R<k> - R<k-1>| <= jacobi_tol (k >= 2); the last d_backward iterates always run, with gradients.
        """
        middle, no_cache = self.middle_layer_indices(), inputs.without_cache()
        latest_real = latest_real_index(layout.real)

        def iterate(r_read: torch.Tensor, seed: bool) -> torch.Tensor:
            fused = h_low if seed else self._fuse(h_low, r_read, recurrence_mask)
            h_end = self._run_layers(middle, fused, no_cache)
            r_out = self._write_state(h_end, r_read, layout.real)
            return states_read(r_out, r_in, latest_real, layout.document_start)

        r_read = states_read(torch.zeros_like(h_low), r_in, latest_real, layout.document_start)
        iterations = 0
        with torch.no_grad():
            for _ in range(path.d_forward - path.d_backward):
                r_next = iterate(r_read, seed=iterations == 0)
                moved = None if path.jacobi_tol is None else float((r_next - r_read).abs().max())
                r_read, iterations = r_next, iterations + 1
                if moved is not None and iterations >= 2 and moved <= path.jacobi_tol:
                    break  # converged: go on to the iterations that carry gradients
        for _ in range(path.d_backward):
            r_read, iterations = iterate(r_read, seed=iterations == 0), iterations + 1
        h_end = self._run_layers(middle, self._fuse(h_low, r_read, recurrence_mask), inputs)
        r_out = gather_states(self._write_state(h_end, r_read, layout.real), r_in, latest_real)
        return h_end, r_out, iterations


def _last_state(r_out: torch.Tensor) -> torch.Tensor:
    """R after the chunk's last token; a copy when it carries gradients, since FSDP2 hooks a module's
    outputs and warns that in-place changes to a view would bypass them."""
    last = r_out[:, -1]
    return last.clone() if last.requires_grad else last
