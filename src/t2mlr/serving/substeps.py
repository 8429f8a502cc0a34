"""The middle block's attention on part of a vLLM step's batch.

vLLM runs a model once per engine step over a flattened batch (decode tokens first, then the prefill
chunks) with one attention metadata per layer, built for the whole batch. T²MLR's middle block cannot
always run that way: its exact prefill processes a chunk one position at a time (token t needs R_{t-1}),
and the Jacobi prefill iterates over the prefill tokens only. `SubBatchAttention` builds the attention
metadata of such a sub-batch with the backend's own metadata builder (the same code vLLM runs for the
whole batch) and puts it in the forward context for the middle layers while they run. Keys and values
are written to the same cache slots the whole step uses, so the blocks above and below, and later steps,
see exactly the keys a token-by-token run leaves behind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata


@dataclass(frozen=True)
class SubBatch:
    """Part of a step's batch: some of its requests (rows), and for each a run of its query tokens.

    rows: (n,) request rows of the step's batch, ascending.
    tokens: (m,) positions in the flattened batch; each row's tokens are contiguous and in order.
    query_lens: (n,) how many tokens each row has here (host tensor).
    seq_lens: (n,) the length of each row's sequence up to and including its last token here (host).
    """

    rows: torch.Tensor
    tokens: torch.Tensor
    query_lens: torch.Tensor
    seq_lens: torch.Tensor

    def common_metadata(self, block_table: torch.Tensor, slot_mapping: torch.Tensor,
                        device: torch.device) -> CommonAttentionMetadata:
        """The sub-batch as vLLM's backend-independent metadata, for one KV-cache group."""
        starts = torch.zeros(len(self.query_lens) + 1, dtype=torch.int32)
        torch.cumsum(self.query_lens.to(torch.int32), 0, out=starts[1:])
        seq_lens = self.seq_lens.to(torch.int32)
        rows = self.rows.to(block_table.device)
        return CommonAttentionMetadata(
            query_start_loc=starts.to(device),
            query_start_loc_cpu=starts,
            seq_lens=seq_lens.to(device),
            num_reqs=len(self.query_lens),
            num_actual_tokens=int(starts[-1]),
            max_query_len=int(self.query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=block_table.index_select(0, rows),
            slot_mapping=slot_mapping.index_select(0, self.tokens.to(slot_mapping.device)),
            causal=True,
            seq_lens_cpu_upper_bound=seq_lens,
            is_prefilling=torch.zeros(len(self.query_lens), dtype=torch.bool, device=device),
        )


class SubBatchAttention:
    """Runs a set of attention layers (the middle block's) on sub-batches of the current step."""

    def __init__(self, layers: Sequence[Any], vllm_config: VllmConfig) -> None:
        self.layers = list(layers)
        self.names = [layer.layer_name for layer in self.layers]
        self.vllm_config = vllm_config
        self._builders: dict[tuple[str, ...], Any] = {}

    @contextmanager
    def running(self, sub: SubBatch | None) -> Iterator[None]:
        """Within the block, the layers attend over `sub` (None: the whole step, nothing changes)."""
        if sub is None:
            yield
            return
        context = get_forward_context()
        metadata, slots = context.attn_metadata, context.slot_mapping
        if not isinstance(metadata, dict) or not isinstance(slots, dict):
            raise TypeError("T²MLR's middle block needs one attention metadata per layer (a dict); "
                            "dual-batch overlap and similar split batches are not supported")
        saved = {name: (metadata[name], slots.get(name)) for name in self.names}
        replaced = self._sub_metadata(sub, metadata, slots)
        try:
            for name, (layer_metadata, layer_slots) in replaced.items():
                metadata[name] = layer_metadata
                slots[name] = layer_slots
            yield
        finally:
            for name, (layer_metadata, layer_slots) in saved.items():
                metadata[name] = layer_metadata
                slots[name] = layer_slots

    def _sub_metadata(self, sub: SubBatch, metadata: dict, slots: dict) -> dict[str, tuple[Any, torch.Tensor]]:
        """One build per KV-cache group: layers sharing a metadata object share a block table."""
        groups: dict[int, list[str]] = {}
        for name in self.names:
            groups.setdefault(id(metadata[name]), []).append(name)
        replaced = {}
        for names in groups.values():
            whole = metadata[names[0]]
            block_table = getattr(whole, "block_table", None)
            if block_table is None:
                raise RuntimeError(f"the attention backend's metadata ({type(whole).__name__}) has no block_table; "
                                   "T²MLR's prefill cannot address its KV cache")
            common = sub.common_metadata(block_table, slots[names[0]], block_table.device)
            built = self._builder(tuple(names)).build(0, common)
            for name in names:
                replaced[name] = (built, common.slot_mapping)
        return replaced

    def _builder(self, names: tuple[str, ...]) -> Any:
        """The backend's metadata builder for these layers, made once (as the model runner makes its own)."""
        if names not in self._builders:
            layer = self.layers[self.names.index(names[0])]
            spec = layer.get_kv_cache_spec(self.vllm_config)
            builder_cls = layer.get_attn_backend().get_builder_cls()
            device = torch.device(self.vllm_config.device_config.device)
            self._builders[names] = builder_cls(dataclasses.replace(spec), list(names), self.vllm_config, device)
        return self._builders[names]
