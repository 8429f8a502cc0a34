"""The KV cache of every block plus the recurrent cache R, in one object (docs/semantics.md §5).

`T2MLRCache` grows with every token (a `DynamicCache`); `T2MLRStaticCache` preallocates its keys, values
and R for a fixed number of tokens (a `StaticCache`), so a decode step has the same shapes every time and
can be compiled once and captured as a CUDA graph.

The recurrent state lives here and not on the module, so everything `generate()` does to the KV cache
(beam reordering, `num_return_sequences` expansion, batch selection, cropping) happens to R as well.
The cache keeps R after every cached token, not only the last one: cropping back to any length then
restores the exact state, and the per-token states are there for analysis or RL replay. It costs
d values per token, a small fraction of the KV cache's 2·L·d_kv.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig, StaticCache

KEYS_WITHOUT_STATES = (
    "the cache holds keys for {past} tokens but recurrent states for {have}: it was filled with "
    "recurrence='off' or by another model; rebuild it with this model's exact or Jacobi path"
)


def _base_config(config: PretrainedConfig | None) -> PretrainedConfig | None:
    """The wrapped decoder's config: the caches are sized by it, not by the T²MLR config around it."""
    if config is not None and getattr(config, "model_type", None) == "t2mlr":
        return config.base_config
    return config


class T2MLRCache(DynamicCache):
    """A `DynamicCache` that also carries the recurrent states R_1..R_t of each row."""

    def __init__(self, config: PretrainedConfig | None = None, **kwargs) -> None:
        super().__init__(config=_base_config(config), **kwargs)
        self.recurrent_states: torch.Tensor | None = None  # (batch, cached tokens, hidden)

    def incoming_state(self, past: int, like: torch.Tensor) -> torch.Tensor:
        """R after the last of the `past` cached tokens (zero before the first), in `like`'s dtype; the
        cache must hold one state per cached token."""
        if past == 0:
            return like.new_zeros(like.shape[0], like.shape[-1])
        stored = self.recurrent_states
        if stored is None or stored.shape[1] != past:
            raise ValueError(KEYS_WITHOUT_STATES.format(past=past, have=0 if stored is None else stored.shape[1]))
        return stored[:, -1].to(like.dtype)

    @property
    def recurrent_state(self) -> torch.Tensor | None:
        """R after the last cached token, shape (batch, hidden); None before the first forward."""
        if self.recurrent_states is None or self.recurrent_states.shape[1] == 0:
            return None
        return self.recurrent_states[:, -1]

    def append_recurrent_states(self, states: torch.Tensor) -> None:
        """Record R after each token of a processed chunk, shape (batch, chunk, hidden)."""
        states = states.detach()
        if self.recurrent_states is None:
            self.recurrent_states = states
        else:
            self.recurrent_states = torch.cat([self.recurrent_states, states], dim=1)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.recurrent_states is not None:
            self.recurrent_states = self.recurrent_states.index_select(0, beam_idx.to(self.recurrent_states.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.recurrent_states is not None:
            self.recurrent_states = self.recurrent_states.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.recurrent_states is not None:
            self.recurrent_states = self.recurrent_states[indices, ...]

    def crop(self, tokens_to_remove: int) -> None:
        """Cut the KV cache and R together: a negative value removes that many tokens, a positive one
        is the length to keep (older transformers), 0 does nothing."""
        super().crop(tokens_to_remove)
        if self.recurrent_states is None or tokens_to_remove == 0:
            return
        kept = self.recurrent_states.shape[1]
        kept = kept + tokens_to_remove if tokens_to_remove < 0 else min(kept, tokens_to_remove)
        self.recurrent_states = self.recurrent_states[:, : max(kept, 0)]

    def reset(self) -> None:
        super().reset()
        self.recurrent_states = None


class T2MLRStaticCache(StaticCache):
    """A `StaticCache` whose R after every token sits in a preallocated (batch, max_cache_len, hidden)
    buffer, written in place at the cached length. Nothing in a decode step then depends on a Python-side
    length, so `torch.compile(..., fullgraph=True)` traces one graph for every step and
    `mode="reduce-overhead"` can capture it as a CUDA graph. `generate(..., cache_implementation="static")`
    builds one; with it the attention mask a forward takes is either (batch, past + chunk), as with
    `T2MLRCache`, or (batch, max_cache_len), the fixed shape `generate()` passes."""

    def __init__(self, config: PretrainedConfig, max_cache_len: int, **kwargs) -> None:
        super().__init__(config=_base_config(config), max_cache_len=max_cache_len, **kwargs)
        self.capacity = max_cache_len  # tokens it holds (StaticCache's own max_cache_len is deprecated in 5.19)
        self.state_buffer: torch.Tensor | None = None  # allocated by the first write
        self.state_count = torch.zeros((), dtype=torch.long)  # states written; a tensor, changed in place

    def padded_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A (batch, tokens so far) 2D mask widened with zeros to (batch, max_cache_len): the free positions."""
        return torch.nn.functional.pad(mask, (0, self.capacity - mask.shape[1]))

    def _allocate(self, states: torch.Tensor) -> None:
        batch, _, hidden = states.shape
        self.state_buffer = states.new_zeros(batch, self.capacity, hidden)
        self.state_count = self.state_count.to(states.device)
        if not torch.compiler.is_compiling():  # fixed addresses: what CUDA-graph capture needs
            torch._dynamo.mark_static_address(self.state_buffer)
            torch._dynamo.mark_static_address(self.state_count)

    def append_recurrent_states(self, states: torch.Tensor) -> None:
        """Write R after each token of a processed chunk at the next free positions."""
        if self.state_buffer is None:
            self._allocate(states)
        positions = self.state_count + torch.arange(states.shape[1], device=states.device)
        self.state_buffer.index_copy_(1, positions, states.detach().to(self.state_buffer.dtype))
        self.state_count.add_(states.shape[1])

    def incoming_state(self, past: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """R after the last cached token (zero before the first), read on the device with no host sync. That
        there is one state per cached token is checked with the forward's other inputs, in the one read of
        `t2mlr.model.checks.check_value_ranges` (eager mode)."""
        if self.state_buffer is None:
            return like.new_zeros(like.shape[0], like.shape[-1])
        last = self.state_buffer.index_select(1, (self.state_count - 1).clamp(min=0).reshape(1))[:, 0]
        return torch.where(self.state_count > 0, last, torch.zeros_like(last)).to(like.dtype)

    @property
    def recurrent_states(self) -> torch.Tensor | None:
        """R after each cached token, (batch, cached tokens, hidden): a view, read with one host sync."""
        if self.state_buffer is None:
            return None
        return self.state_buffer[:, : int(self.state_count)]

    @property
    def recurrent_state(self) -> torch.Tensor | None:
        """R after the last cached token, (batch, hidden); None before the first forward."""
        states = self.recurrent_states
        return None if states is None or states.shape[1] == 0 else states[:, -1]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.state_buffer is not None:
            self.state_buffer.copy_(self.state_buffer.index_select(0, beam_idx.to(self.state_buffer.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse_batch_change("batch_repeat_interleave")
        super().batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse_batch_change("batch_select_indices")
        super().batch_select_indices(indices)

    def _refuse_batch_change(self, what: str) -> None:
        if self.state_buffer is not None:
            raise ValueError(f"{what} would change the batch of a filled T2MLRStaticCache, whose buffers are fixed; "
                             "use a T2MLRCache (the default cache of generate()) for that")

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("a T2MLRStaticCache cannot be cropped (assisted decoding needs T2MLRCache, the default cache)")

    def reset(self) -> None:
        super().reset()
        if self.state_buffer is not None:
            self.state_buffer.zero_()
        self.state_count.zero_()
