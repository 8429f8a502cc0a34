"""Token layout of a chunk and the attention masks its decoder layers need (docs/semantics.md §4).

The recurrence needs three per-token facts besides the tokens themselves: where each token sits in
its document (`position_ids`), whether it is real or padding, and whether it starts a document (R is
read as 0 there). Packed rows (several documents in one row) also need attention kept inside each
document; transformers' mask builders take an extra mask function for that.

The Jacobi path moves R between tokens with gathers instead of a plain shift: a token reads the state
written by the latest *real* token before it, so R crosses any run of padding within one iteration,
as it does in the exact path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.masking_utils import (
    create_causal_mask,
    create_sliding_window_causal_mask,
)

from .cache import T2MLRCache, T2MLRStaticCache


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
    cache: DynamicCache | None

    def without_cache(self) -> "LayerInputs":
        """The same inputs for a pass that must not write keys and values (the Jacobi iterations of a
        prefill): the chunk attends to itself only, so 4D masks keep just its own key columns (a static
        cache's masks span every position it can hold)."""
        return replace(self, cache=None, masks=[_own_keys(mask) for mask in self.masks])


def _own_keys(mask: Any) -> Any:
    """A prefill's mask cut to the chunk's keys (a no-op unless it was sized for a static cache)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-1] > mask.shape[-2]:
        return mask[..., : mask.shape[-2]]
    return mask


# ---------------------------------------------------------------------------------------------- positions


def positions_within_documents(starts: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... along the last dimension, restarting at every True of `starts`.

    The first element of every row must be a start (or the row's positions count from its beginning).
    """
    index = torch.arange(starts.shape[-1], device=starts.device).expand_as(starts)
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - last_start


def starts_a_later_document(starts: torch.Tensor, real: torch.Tensor) -> bool:
    """Whether a row holds a document start after its first real token (a packed chunk); one host sync."""
    first_real = real.long().cumsum(-1) == 1
    return bool((starts[:, 1:] & ~first_real[:, 1:]).any())


def token_layout(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    past: int | torch.Tensor,
    batch: int,
    length: int,
    device: torch.device,
) -> TokenLayout:
    """Positions, padding and document starts of a chunk of `length` tokens after `past` cached ones.

    `attention_mask` covers the cached tokens and the chunk, and may run on past them (a static cache's
    fixed-width mask, zero at the free positions); `past` is a 0-d tensor for a static cache."""
    if attention_mask is not None:
        real = chunk_columns(attention_mask, past, length).to(device=device, dtype=torch.bool)
    else:
        real = torch.ones(batch, length, dtype=torch.bool, device=device)
    if document_ids is not None:
        if past > 0:
            raise ValueError("document_ids can only be given for a sequence processed from its start (no cache)")
        if tuple(document_ids.shape) != (batch, length):
            raise ValueError(f"document_ids must have shape ({batch}, {length}), got {tuple(document_ids.shape)}")
        starts = torch.ones_like(real)
        starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
        if position_ids is None:
            position_ids = positions_within_documents(starts)
    if position_ids is None:
        if attention_mask is not None:
            position_ids = chunk_columns((attention_mask.long().cumsum(-1) - 1).clamp(min=0), past, length)
        else:
            position_ids = (torch.arange(length, device=device) + past).expand(batch, length)
    position_ids = position_ids.to(device).expand(batch, length)
    if document_ids is None:
        starts = position_ids == 0
    starts = starts & real
    packed = False
    if length > 1 and past > 0:
        _check_no_new_document(starts, real)
    elif length > 1:
        packed = _is_packed(starts, real)
    return TokenLayout(
        position_ids=position_ids,
        real=real,
        document_start=starts,
        document_ids=starts.long().cumsum(-1) if packed else None,
    )


def chunk_columns(per_token: torch.Tensor, past: int | torch.Tensor, length: int) -> torch.Tensor:
    """Columns past .. past + length - 1 of a (batch, tokens) tensor; `past` may be a 0-d device tensor."""
    if isinstance(past, torch.Tensor):
        return per_token.index_select(1, past.to(per_token.device) + torch.arange(length, device=per_token.device))
    return per_token[:, past : past + length]


def _is_packed(starts: torch.Tensor, real: torch.Tensor) -> bool:
    """Packed or not decides the mask builders' arguments. Under torch.compile the answer cannot be read
    back from the device without a graph break, so every multi-token chunk that starts a sequence is
    treated as packed there: the same-document mask is then a no-op for rows holding one document."""
    if torch.compiler.is_compiling():
        return True
    return starts_a_later_document(starts, real)


def _check_no_new_document(starts: torch.Tensor, real: torch.Tensor) -> None:
    """A chunk that continues a cache must stay in the cached document. Like the value checks, this needs
    a host read, so it is skipped under torch.compile (a continued chunk is never treated as packed)."""
    if torch.compiler.is_compiling():
        return
    if starts_a_later_document(starts, real):
        raise ValueError("a new document (position 0) cannot start inside a chunk that continues a cache")


# ---------------------------------------------------------------------------------------------- masks


def _same_document(document_ids: torch.Tensor) -> Callable[[Any, Any, Any, Any], Any]:
    """Mask function for transformers' mask builders: a query sees only keys of its own document."""

    def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        return document_ids[batch_idx, q_idx] == document_ids[batch_idx, kv_idx]

    return inner


def layer_attention_kinds(base_config: PretrainedConfig) -> list[str]:
    """Which mask each layer needs: "full_attention" or "sliding_attention" (Mistral, Qwen2 windows)."""
    layer_types = getattr(base_config, "layer_types", None)
    if layer_types is not None:
        return list(layer_types)
    sliding = getattr(base_config, "sliding_window", None)
    kind = "sliding_attention" if sliding is not None else "full_attention"
    return [kind] * base_config.num_hidden_layers


def layer_inputs(
    base_config: PretrainedConfig,
    rotary_emb: torch.nn.Module,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layout: TokenLayout,
    cache: DynamicCache | None,
    full_masks: bool = False,
) -> LayerInputs:
    """Masks (one per layer, built once per attention kind) and rotary embeddings of a chunk. `cache`
    (a T2MLRCache, or a baseline's own DynamicCache subclass) sizes the masks. `full_masks`: build every
    mask even where sdpa could skip it (the fixed-point solver passes over spans that follow cached keys)."""
    # A static cache's masks span all its positions, so the exact path's one-query steps cannot fall back on
    # sdpa's `is_causal` (a skipped mask) as they do with a growing cache: every mask is built.
    full_masks = full_masks or isinstance(cache, T2MLRStaticCache)
    extra: dict[str, Any] = {"allow_is_causal_skip": False} if full_masks else {}
    if layout.document_ids is not None:
        extra["and_mask_function"] = _same_document(layout.document_ids)
        if attention_mask is None:  # an explicit mask turns off transformers' own packing detection,
            attention_mask = layout.real.long()  # which remaps indices that our mask function reads
    built: dict[str, Any] = {}
    kinds = layer_attention_kinds(base_config)
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
    if layout.document_ids is not None:
        _check_masks_keep_documents(built.values(), base_config)
    return LayerInputs(
        masks=[built[kind] for kind in kinds],
        position_ids=layout.position_ids,
        position_embeddings=rotary_emb(hidden, position_ids=layout.position_ids),
        cache=cache,
    )


def _check_masks_keep_documents(masks: Any, base_config: PretrainedConfig) -> None:
    """Packed rows keep attention inside each document through the same-document mask function, which only
    a materialised 4D mask carries ('sdpa', 'eager'); flash attention's masks (None or 2D) drop it, and
    its varlen path cannot serve the exact path's one-token steps, so documents would attend to each other."""
    if all(isinstance(mask, torch.Tensor) and mask.dim() == 4 for mask in masks):
        return
    raise ValueError(
        "packed rows (several documents in one row: document_ids, or position_ids restarting at 0 as TRL's "
        "padding_free and packing write them) need attn_implementation 'sdpa' or 'eager', whose masks keep each "
        f"document to itself; {getattr(base_config, '_attn_implementation', None)!r} does not: load the model "
        "with attn_implementation='sdpa', or train without packing / padding_free"
    )


def chunk_kv_offset(cache: T2MLRCache | None, layer_idx: int) -> int:
    """Absolute index of the first key column of the chunk's mask for this layer."""
    return 0 if cache is None else cache.get_mask_sizes(1, layer_idx)[1]


def rows_mask(mask: Any, rows: slice, cache: DynamicCache, layer_idx: int, chunk_offset: int) -> Any:
    """Rows `rows` of the chunk's mask, cut to the keys the layer's cache holds once they are written: a
    one-token step of the sequential exact path, or a span the fixed-point solver passes over at once."""
    queries = rows.stop - rows.start
    if mask is None and queries > 1:  # sdpa's is_causal would align a span's queries to the first keys
        raise ValueError("a span of several queries after cached keys needs the chunk's masks built in full")
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise ValueError(
            "the exact path needs 'eager' or 'sdpa' attention (4D masks); this model uses "
            f"{type(mask).__name__} masks: switch attn_implementation, or use recurrence='jacobi'"
        )
    kv_length, kv_offset = cache.get_mask_sizes(queries, layer_idx) if len(cache.layers) > layer_idx else (queries, 0)
    start = kv_offset - chunk_offset
    return mask[:, :, rows, start : start + kv_length]


# ---------------------------------------------------------------------------------------------- moving R


def latest_real_index(real: torch.Tensor) -> torch.Tensor:
    """For each token, the index of the latest real (non-pad) token at or before it, or -1."""
    index = torch.arange(real.shape[1], device=real.device).expand_as(real)
    return torch.where(real, index, torch.full_like(index, -1)).cummax(dim=1).values


def gather_states(r_out: torch.Tensor, r_in: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """r_out[:, source[t]] per token, with source -1 meaning `r_in` (the chunk's incoming R)."""
    padded = torch.cat([r_in[:, None], r_out], dim=1)
    return padded.gather(1, (source + 1)[..., None].expand(-1, -1, r_out.shape[-1]))


def reset_at_starts(r: torch.Tensor, document_start: torch.Tensor) -> torch.Tensor:
    """R as read by a token: zero where the token starts a document."""
    return r.masked_fill(document_start[..., None], 0.0)


def states_read(
    r_out: torch.Tensor, r_in: torch.Tensor, latest_real: torch.Tensor, document_start: torch.Tensor
) -> torch.Tensor:
    """What each token reads, given what each token wrote: the state after the latest real token
    before it (`r_in` if none), zero at document starts. Without padding this is ShiftRight."""
    previous = torch.cat([torch.full_like(latest_real[:, :1], -1), latest_real[:, :-1]], dim=1)
    return reset_at_starts(gather_states(r_out, r_in, previous), document_start)
