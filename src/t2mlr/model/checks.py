"""Input checks of `T2MLRForCausalLM.forward`: each bad input is a `ValueError` that names the argument
and what is allowed, raised before anything reaches a decoder layer (where it would surface as someone
else's exception or, on a GPU, as an opaque device-side assert).

Value ranges (token ids, labels, positions) need the data, so they are read back from the device in a
single host sync per forward. Under `torch.compile` that read is skipped: a graph cannot contain it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from t2mlr.utils import IGNORE_INDEX, nearest_name

from .cache import KEYS_WITHOUT_STATES, T2MLRCache, T2MLRStaticCache
from .layout import TokenLayout, token_layout

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def chunk_shape(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, hidden_size: int
) -> tuple[int, int, torch.device]:
    """Batch, length and device of the chunk, after checking the inputs' types and shapes."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size or 0 in inputs_embeds.shape[:2]:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq, {hidden_size}) with batch, seq >= 1, "
                f"got {tuple(inputs_embeds.shape)}"
            )
        return inputs_embeds.shape[0], inputs_embeds.shape[1], inputs_embeds.device
    if input_ids.dtype not in INTEGER_DTYPES:
        raise ValueError(f"input_ids must be an integer tensor of token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids must have shape (batch, seq) with batch, seq >= 1, got {tuple(input_ids.shape)}")
    return input_ids.shape[0], input_ids.shape[1], input_ids.device


def check_value_ranges(
    input_ids: torch.Tensor | None,
    position_ids: torch.Tensor,
    vocab_size: int,
    max_positions: int | None,
    counts: Sequence[torch.Tensor] = (),
) -> list[int]:
    """Token ids inside the vocabulary and positions below the base model's limit, read back in one host
    sync (each sync stalls a GPU decode step). `counts`, 0-d
    integer tensors other checks need (a static cache's lengths), ride along in that sync and are returned;
    under torch.compile nothing is read and the list is empty."""
    if torch.compiler.is_compiling():
        return []
    bounds = [position_ids.max().reshape(1)]
    bounds.extend(c.to(position_ids.device, position_ids.dtype).reshape(1) for c in counts)
    if input_ids is not None:
        bounds.append(torch.stack(torch.aminmax(input_ids)).to(position_ids.dtype))
    values = torch.cat(bounds).tolist()
    highest_position, read = values[0], values[1 : 1 + len(counts)]
    values = values[:1] + values[1 + len(counts):]
    if input_ids is not None:
        low, high = values[1:3]
        if low < 0 or high >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{low}, {high}]")
    if max_positions is not None and highest_position >= max_positions:
        raise ValueError(
            f"position {highest_position} exceeds the model's limit of {max_positions} positions (what the base "
            "model's rotary embedding covers: max_position_embeddings, times the factor of a RoPE scaling it is "
            "configured with); shorten the sequence, pack it into documents, or give the base config a RoPE scaling "
            "(rope_parameters, e.g. {'rope_type': 'linear', 'factor': 4.0})"
        )
    return read


def position_limit(base_config: Any) -> int | None:
    """How many positions the base model's rotary embedding covers: `max_position_embeddings`, extended by
    a RoPE scaling's factor (linear, yarn, llama3, longrope: factor × the original length, where the config
    gives one), unbounded for dynamic NTK scaling, which rescales itself to any length. None: no limit."""
    limit = getattr(base_config, "max_position_embeddings", None)
    rope = getattr(base_config, "rope_parameters", None) or getattr(base_config, "rope_scaling", None) or {}
    if limit is None or not isinstance(rope, dict):
        return limit
    per_type = [rope] if "rope_type" in rope or "type" in rope else [v for v in rope.values() if isinstance(v, dict)]
    bounded = [scaled for scaled in (_scaled_limit(limit, parameters) for parameters in per_type) if scaled is not None]
    if per_type and not bounded:
        return None
    return min(bounded, default=limit)


def _scaled_limit(limit: int, rope: dict[str, Any]) -> int | None:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "dynamic":
        return None
    factor = rope.get("factor")
    if kind == "default" or factor is None:
        return limit
    original = rope.get("original_max_position_embeddings") or limit
    return max(limit, int(factor * original))


def checked_chunk(
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: DynamicCache | None,
    hidden_size: int,
    vocab_size: int,
    max_positions: int | None,
    document_ids: torch.Tensor | None = None,
    reads_states: bool = True,
) -> tuple[TokenLayout, torch.Tensor | None]:
    """Every check of a forward's inputs, in order, and the chunk's token layout (positions, padding,
    document starts) after the `cache.get_seq_length()` tokens the cache holds. Returns the layout and
    the checked attention mask. `reads_states`: the forward continues the cache's recurrent states (any
    path but recurrence="off"), so a static cache must hold one per cached token."""
    batch, length, device = chunk_shape(input_ids, inputs_embeds, hidden_size)
    past = cached_length(cache)
    static, growing_mask = isinstance(cache, T2MLRStaticCache), None
    if static:
        attention_mask, growing_mask = static_attention_mask(attention_mask, batch, cache)
    else:
        attention_mask = checked_attention_mask(attention_mask, batch, past + length)
    layout = token_layout(attention_mask, position_ids, document_ids, past, batch, length, device)
    counts = (torch.as_tensor(past), cache.state_count) if static else ()
    read = check_value_ranges(input_ids, layout.position_ids, vocab_size, max_positions, counts)
    if read:
        check_static_lengths(cache, *read, batch, length, growing_mask, reads_states)
    return layout, attention_mask


def checked_labels(
    labels: torch.Tensor | None, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, vocab_size: int
) -> None:
    """A causal LM's labels: the inputs' (batch, seq) shape, ids in the vocabulary or -100 (ignored), read
    back in one host sync (skipped under torch.compile). Bad inputs themselves are the backbone's to report."""
    reference = input_ids if input_ids is not None else inputs_embeds
    if labels is None or reference is None or reference.dim() < 2:
        return
    if tuple(labels.shape) != tuple(reference.shape[:2]):
        raise ValueError(f"labels must have the shape of the inputs {tuple(reference.shape[:2])}, got {tuple(labels.shape)}")
    if torch.compiler.is_compiling():
        return
    low, high = torch.stack(torch.aminmax(labels.masked_fill(labels == IGNORE_INDEX, 0))).tolist()
    if low < 0 or high >= vocab_size:
        raise ValueError(f"labels must lie in [0, {vocab_size}) or be {IGNORE_INDEX} (ignored), got range [{low}, {high}]")


def checked_cache(past_key_values: Any, use_cache: bool | None) -> T2MLRCache | T2MLRStaticCache | None:
    """The cache a forward continues: this model's own, which carries R beside the keys and values.

    Any other cache is refused, an empty `DynamicCache` too: converting it would fill a new object while
    the caller's stays empty, and a loop that passes the caller's object again would silently restart
    the sequence at position 0 (docs/decoding.md, "Decoding by hand")."""
    if past_key_values is None:
        return None
    if not isinstance(past_key_values, (T2MLRCache, T2MLRStaticCache)):
        raise ValueError(
            "past_key_values must be a T2MLRCache or T2MLRStaticCache, which carry the recurrent state R beside "
            f"the keys and values; got {type(past_key_values).__name__}. Pass none with use_cache=True and continue "
            "from out.past_key_values, or create one with T2MLRCache(config=model.config). (PEFT's prefix tuning "
            "passes a cache of virtual keys, which have no recurrent state: it is not supported; LoRA is)"
        )
    if use_cache is False:
        raise ValueError("use_cache=False contradicts the past_key_values that was passed")
    return past_key_values


def checked_attention_mask(mask: torch.Tensor | None, batch: int, total: int) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dim() != 2 or tuple(mask.shape) != (batch, total):
        raise ValueError(f"attention_mask must be 2D (batch, past + seq) = ({batch}, {total}), got {tuple(mask.shape)}")
    return mask


def cached_length(cache: T2MLRCache | T2MLRStaticCache | None) -> int | torch.Tensor:
    """Tokens the cache holds before this chunk. A static cache keeps its length on the device (a 0-d
    tensor its layers advance in place), so this returns a copy taken before any layer writes."""
    past = cache.get_seq_length() if cache is not None else 0
    return past.clone() if isinstance(past, torch.Tensor) else past


def static_attention_mask(
    mask: torch.Tensor | None, batch: int, cache: T2MLRStaticCache
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A static cache's 2D mask, (batch, max_cache_len): given so (the fixed shape a compiled step needs),
    or given as (batch, past + seq) and padded with zeros for the free positions. Returns that mask and the
    growing one as given (None when fixed), which `check_static_lengths` checks against the cache's length
    once that has been read; nothing here reads the device."""
    if mask is None or (mask.dim() == 2 and tuple(mask.shape) == (batch, cache.capacity)):
        return mask, None
    if mask.dim() != 2 or mask.shape[0] != batch:
        raise ValueError(f"attention_mask must be 2D (batch, past + seq) with batch {batch}, got {tuple(mask.shape)}")
    if mask.shape[1] > cache.capacity:
        raise ValueError(f"the chunk ends at token {mask.shape[1]} but the static cache holds {cache.capacity}")
    return cache.padded_mask(mask), mask


def check_static_lengths(
    cache: T2MLRStaticCache, past: int, states: int, batch: int, length: int, growing_mask: torch.Tensor | None,
    reads_states: bool,
) -> None:
    """The checks a static cache's lengths need (read with the value ranges, in eager mode only): the chunk
    fits, a growing mask covers exactly past + seq tokens, and (`reads_states`) one R per cached token."""
    total = past + length
    if total > cache.capacity:
        raise ValueError(f"the chunk ends at token {total} but the static cache holds {cache.capacity}")
    checked_attention_mask(growing_mask, batch, total)
    if reads_states and states != past:
        raise ValueError(KEYS_WITHOUT_STATES.format(past=past, have=states))


def checked_recurrence_mask(mask: torch.Tensor | None, policy: str, batch: int, length: int) -> torch.Tensor | None:
    """The per-token recurrence mask as bools, or None under policy "all" (every real token fuses R)."""
    if policy == "all":
        if mask is not None:
            raise ValueError("recurrence_mask was passed but recurrence_mask_policy='all'; set the policy to 'mask'")
        return None
    if mask is None:
        raise ValueError("recurrence_mask_policy='mask' needs a recurrence_mask (batch, seq) for every forward")
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"recurrence_mask must have shape ({batch}, {length}), got {tuple(mask.shape)}")
    return mask.bool()


def checked_initial_states(
    states: torch.Tensor | None, recurrence: str, batch: int, length: int, hidden_size: int, exact: bool = False
) -> torch.Tensor | None:
    """Given recurrent states start the Jacobi iteration; they must cover every token of the chunk."""
    if states is None:
        if exact:
            raise ValueError("exact_states=True says the given initial_states are exact: pass initial_states too")
        return None
    if recurrence != "jacobi":
        raise ValueError(f"initial_states start the Jacobi iteration: pass recurrence='jacobi', not {recurrence!r}")
    if tuple(states.shape) != (batch, length, hidden_size):
        raise ValueError(
            f"initial_states must hold R after every token, shape ({batch}, {length}, {hidden_size}), "
            f"got {tuple(states.shape)}"
        )
    return states.detach()


def check_attention_weights_available(implementations: Iterable[str | None]) -> None:
    """`output_attentions=True` needs the eager attention, the one that returns its weights (SDPA's, flash's
    and flex's kernels never form them); refused before any compute, from the argument and the config alike."""
    others = sorted({str(name) for name in implementations if name != "eager"})
    if others:
        raise ValueError(
            f"output_attentions=True needs attn_implementation='eager', the attention that returns its weights; this "
            f"model runs {', '.join(others)}, whose kernel does not: call model.set_attn_implementation('eager') first "
            "(or load it with attn_implementation='eager'), or leave output_attentions off"
        )


def check_block_count(layers: Sequence[Any], num_layers: int) -> None:
    """The backbone runs the blocks its config places (l_start..l_end counts in them): a block list that was
    changed after building (PEFT's `layer_replication`) would leave blocks unrun or shift the recurrence."""
    if len(layers) != num_layers:
        raise ValueError(
            f"the backbone holds {len(layers)} decoder blocks but its config places the recurrence in a "
            f"{num_layers}-block model; changing the block list (PEFT's layer_replication) is not supported"
        )


# the scalar gates of the fusion variants and the linears each multiplies (`t2mlr.model.fusion`)
GATES_AND_WHAT_THEY_SCALE = {"gamma_cur": ("f_cur",), "gamma_rec": ("f_rec", "w_rec", "w_down", "w_up")}


def check_gates_pass_gradients(fusion: torch.nn.Module) -> None:
    """Training that adapts the fusion's linears (LoRA on f_cur, f_rec, w_rec) needs the gates that scale
    them to be trainable too, or non-zero: tanh(γ) multiplies their contribution, so behind a frozen γ = 0
    they get no gradient, ever. Reads parameter names, so a PEFT-wrapped fusion (`modules_to_save`, LoRA
    layers) is checked as it is; the gates' values are read (one host sync) only in the failing case."""
    params = list(fusion.named_parameters())
    for gate, scaled in GATES_AND_WHAT_THEY_SCALE.items():
        gates = [p for name, p in params if name.split(".")[-1] == gate]
        if not gates or any(p.requires_grad for p in gates):
            continue
        trained = [name for name, p in params if p.requires_grad and set(scaled) & set(name.split("."))]
        if trained and all(float(p) == 0.0 for p in gates):
            raise ValueError(
                f"{', '.join(trained)} of the fusion are trained but their gate {gate} is frozen at 0, so they get "
                f"no gradient (tanh({gate}) multiplies them): train the gates too (with PEFT: "
                "modules_to_save=['fusion'] instead of LoRA on the fusion's linears)"
            )


def check_no_misspelt_arguments(extra: Iterable[str], known: Iterable[str]) -> None:
    """Keyword arguments a forward does not name are accepted, as `LlamaModel` accepts them (tools pass
    their own, e.g. TRL's `logits_to_keep`), but one spelt like a known argument is a typo that would
    silently change nothing: `recurence="exact"` would run the config's path instead."""
    if not extra or torch.compiler.is_compiling():  # a compiled step passes none; difflib does not trace
        return
    known = list(known)
    for name in extra:
        guess = nearest_name(name, known, cutoff=0.8)
        if guess is not None and guess != name:  # the head's own arguments reach the backbone too (logits_to_keep)
            raise ValueError(f"unknown argument {name!r}: did you mean {guess!r}?")
