"""`T2MLRCache`: the KV cache of every block plus the recurrent cache R, in one object (docs/semantics.md §5).

The recurrent state lives here and not on the module, so everything `generate()` does to the KV cache
(beam reordering, `num_return_sequences` expansion, batch selection, cropping) happens to R as well.
The cache keeps R after every cached token, not only the last one: cropping back to any length then
restores the exact state, and the per-token states are there for analysis or RL replay. It costs
d values per token, a small fraction of the KV cache's 2·L·d_kv.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig


class T2MLRCache(DynamicCache):
    """A `DynamicCache` that also carries the recurrent states R_1..R_t of each row."""

    def __init__(self, config: PretrainedConfig | None = None, **kwargs) -> None:
        if config is not None and getattr(config, "model_type", None) == "t2mlr":
            config = config.base_config
        super().__init__(config=config, **kwargs)
        self.recurrent_states: torch.Tensor | None = None  # (batch, cached tokens, hidden)

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
