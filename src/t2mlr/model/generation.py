"""How `generate()` drives T²MLR: the cache it gets, the path of each chunk, and the prompt's prefill.

R lives in the `T2MLRCache` passed as `past_key_values`, so everything `generate()` does to the cache
(beam reordering, expansion for `num_return_sequences`, cropping in assisted decoding) happens to R
too, and nothing is stored on the module. The prompt runs on the config's evaluation path (exact by
default, in train mode too) or on the Jacobi path with a chosen depth; every later chunk continues the
cache on the exact path: one token per step, where both paths coincide, or token by token for the
verification chunks of assisted decoding.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin

from t2mlr.settings import check_depths, check_jacobi_tol

from .cache import T2MLRCache, T2MLRStaticCache

PREFILL_PATHS = ("exact", "jacobi", "fixed_point")
JACOBI_ONLY_KWARGS = ("d_forward", "d_backward", "jacobi_tol")


class T2MLRGenerationMixin(GenerationMixin):
    """`GenerationMixin` plus the prompt's forward path and the recurrence mask of generated tokens."""

    def _prepare_cache_for_generation(self, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any):
        """generate() gets a T2MLRCache, so R is reordered, expanded and cropped with the KV cache;
        `cache_implementation="static"` gets a T2MLRStaticCache (through `_prepare_static_cache`)."""
        if model_kwargs.get("past_key_values") is None and generation_config.use_cache is not False:
            implementation = generation_config.cache_implementation
            if implementation is None:
                model_kwargs["past_key_values"] = T2MLRCache(config=self.config.base_config)
            elif implementation != "static":
                raise ValueError(
                    f"cache_implementation={implementation!r} is not available for T²MLR, whose cache also "
                    "carries R: use 'static' (T2MLRStaticCache) or none (T2MLRCache)"
                )
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def _prepare_static_cache(self, cache_implementation: str, batch_size: int, max_cache_len: int, *args: Any,
                              **kwargs: Any) -> T2MLRStaticCache:
        """The static cache generate() builds for cache_implementation="static": R preallocated with the keys.
        Sized as transformers sizes its own: never shorter than an earlier call's, so that a compiled step is not
        traced again for a shorter generation (and T²MLR and a plain model decode over equal widths)."""
        length = max(max_cache_len, getattr(self, "_previous_max_cache_length", -1))
        self._previous_max_cache_length = length
        return T2MLRStaticCache(self.config.base_config, max_cache_len=length)

    def create_masks_for_generate(self, attention_mask: torch.Tensor | None, past_key_values: Any,
                                  **kwargs: Any) -> torch.Tensor | None:
        """generate() asks a model with a compilable cache for its step's mask. T²MLR's forward needs the 2D
        mask (it also tells which tokens are padding, for R); padded to the static cache's length it has
        the same shape at every step."""
        if attention_mask is None or not isinstance(past_key_values, T2MLRStaticCache):
            return attention_mask
        return past_key_values.padded_mask(attention_mask)

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        *args: Any,
        inputs_embeds: torch.Tensor | None = None,
        recurrence_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Per-step inputs: once the cache holds the prompt, chunks continue it on the exact path; with
        recurrence_mask_policy="mask", `recurrence_mask` covers the prompt and generated tokens recur.
        `inputs_embeds` is named here because generate() accepts a prompt given as embeddings (soft
        prompts, multimodal front-ends) only from a model whose signature names it; the prompt's step
        takes them, later steps the generated ids, as transformers arranges."""
        inputs = super().prepare_inputs_for_generation(input_ids, *args, inputs_embeds=inputs_embeds, **kwargs)
        cache = inputs.get("past_key_values")
        past = cache.get_seq_length() if cache is not None else 0
        if past > 0 and self.config.forward_path(self.training, inputs.get("recurrence")).recurrence == "jacobi":
            inputs["recurrence"] = "exact"
            for name in JACOBI_ONLY_KWARGS:
                inputs.pop(name, None)
        if self.config.recurrence_mask_policy == "mask":
            inputs["recurrence_mask"] = generation_recurrence_mask(
                recurrence_mask, input_ids.shape, past, inputs["input_ids"].shape[1]
            )
        elif recurrence_mask is not None:
            inputs["recurrence_mask"] = recurrence_mask  # forward raises its policy error
        return inputs

    def generate(
        self,
        *args: Any,
        prefill: str | None = None,
        prefill_depth: int | None = None,
        prefill_tol: float | None = None,
        output_recurrent_states: bool = False,
        **kwargs: Any,
    ):
        """`GenerationMixin.generate` plus the prompt's forward path.

        The prompt and every later token take the config's evaluation path (`eval_recurrence`, exact by
        default) whether the model is in train or eval mode: RL rollouts generate in train mode, and must
        decode what the model computes. prefill="exact" runs the prompt's middle block token by token (or
        by the config's `exact_solver`); prefill="fixed_point" computes the same by the fixed-point solver
        (`prefill_tol`: its fixed_point_tol, default the config's; docs/model.md "Solving the exact path");
        prefill="jacobi" runs it in parallel with `prefill_depth` cache iterations (default: the config's
        d_forward), approximate unless prefill_depth >= prompt length; `prefill_tol` stops those
        iterations early once max |ΔR| <= tol (a trained model's cache often converges in a few, so a
        generous depth with a tolerance costs only what the prompt needs). With
        recurrence_mask_policy="mask", pass `recurrence_mask` for the prompt; generated tokens recur.

        `output_recurrent_states=True` (with `return_dict_in_generate=True`) adds `recurrent_states`,
        (sequences, prompt + generated, hidden): the exact R after every token of every returned
        sequence, e.g. for replaying a rollout on the Jacobi path (`initial_states=`). After an exact
        prefill, greedy decoding and sampling read them from the cache the decoding filled (plus one step
        for the last token; a static cache has room for it only when decoding stopped before max_new_tokens);
        beam search and a Jacobi prefill (whose prompt states are approximate) recompute them on the exact
        path.
        """
        kwargs.update(prefill_kwargs(prefill, prefill_depth, prefill_tol, self.config.d_forward))
        kwargs.setdefault("recurrence", self.config.eval_recurrence)  # decoding's path, in train mode too
        if not output_recurrent_states:
            return super().generate(*args, **kwargs)
        asked = kwargs.get("return_dict_in_generate", getattr(kwargs.get("generation_config"), "return_dict_in_generate", None))
        if not asked:
            raise ValueError("output_recurrent_states=True needs return_dict_in_generate=True (the states are a field of it)")
        prompt = kwargs.get("input_ids", args[0] if args else None)
        if prompt is None:
            raise ValueError("output_recurrent_states=True needs the prompt's input_ids")
        prompt_mask = self._prompt_attention_mask(prompt, kwargs)
        out = super().generate(*args, **kwargs)
        out["recurrent_states"] = self._states_of_sequences(out, prompt_mask, kwargs)
        return out

    def _prompt_attention_mask(self, prompt: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """The prompt's padding mask: the one passed, else what generate() infers (pad tokens are padding
        when a pad id is set, occurs in the prompt and differs from the EOS ids)."""
        if kwargs.get("attention_mask") is not None:
            return kwargs["attention_mask"]
        config = kwargs.get("generation_config") or self.generation_config
        pad = kwargs.get("pad_token_id", config.pad_token_id)
        eos = kwargs.get("eos_token_id", config.eos_token_id)
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if pad is not None and pad not in eos and bool((prompt == pad).any()):
            return prompt.ne(pad).long()
        return torch.ones_like(prompt)

    def _states_of_sequences(self, out: Any, prompt_mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """R after every token of `out.sequences` (see `generate`)."""
        cache, sequences = out.past_key_values, out.sequences
        rows, length = sequences.shape
        owner = torch.arange(rows, device=prompt_mask.device) // (rows // prompt_mask.shape[0])  # its prompt's row
        generated = prompt_mask.new_ones(rows, length - prompt_mask.shape[1])
        full_mask = torch.cat([prompt_mask[owner], generated], dim=1)
        config = kwargs.get("generation_config") or self.generation_config
        beams = (kwargs.get("num_beams") or config.num_beams or 1) > 1
        exact_prompt = self.config.forward_path(False, kwargs.get("recurrence")).recurrence == "exact"
        with torch.no_grad():
            reusable = isinstance(cache, (T2MLRCache, T2MLRStaticCache)) and int(cache.get_seq_length()) == length - 1
            if isinstance(cache, T2MLRStaticCache):  # generate() sizes it without room for the last token
                reusable = reusable and cache.capacity >= length
            if reusable and exact_prompt and not beams:
                self(sequences[:, -1:], attention_mask=full_mask, past_key_values=cache, use_cache=True,
                     recurrence="exact")
                return cache.recurrent_states.clone()  # a static cache's are a view of its buffer
            fresh = T2MLRCache(config=self.config.base_config)
            self(sequences, attention_mask=full_mask, past_key_values=fresh, use_cache=True, recurrence="exact")
            return fresh.recurrent_states


def prefill_kwargs(prefill: str | None, depth: int | None, tol: float | None, default_depth: int) -> dict[str, Any]:
    """Forward arguments of the prompt's chunk for a prefill choice (checked here, once)."""
    if prefill != "jacobi" and depth is not None or prefill not in ("jacobi", "fixed_point") and tol is not None:
        raise ValueError(
            "prefill_depth and prefill_tol (--prefill-depth, --prefill-tol) apply to prefill='jacobi' only "
            "(prefill_tol also to 'fixed_point'): the exact prefill has no Jacobi iterations, so give them with "
            "jacobi only"
        )
    if prefill is None:
        return {}
    if prefill not in PREFILL_PATHS:
        raise ValueError(f"prefill must be one of {PREFILL_PATHS}, got {prefill!r}")
    if prefill == "exact":
        return {"recurrence": "exact"}
    if prefill == "fixed_point":  # the exact path by the fixed-point solver (docs/model.md); tol: its fixed_point_tol
        return {"recurrence": "exact", "exact_solver": "fixed_point", "fixed_point_tol": tol}
    depth = default_depth if depth is None else depth
    check_depths(depth, 1)
    check_jacobi_tol(tol, "prefill_tol")
    return {"recurrence": "jacobi", "d_forward": depth, "d_backward": 1, "jacobi_tol": tol}


def generation_recurrence_mask(
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
