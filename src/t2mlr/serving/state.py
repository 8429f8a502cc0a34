"""The recurrent state R as vLLM per-request state, held the way vLLM holds a Mamba layer's state.

vLLM keeps the state of its state-space and hybrid models (Mamba, Jamba, NemotronH, LFM2) in a "Mamba"
KV-cache group: every running request owns one slot, a layer declares the slot's shapes and dtypes
(`MambaBase.get_state_shape` / `get_state_dtype`), and the scheduler allocates, frees and recomputes the
slot with the request (continuous batching, preemption and recomputation included). T²MLR's R is such a
state: one hidden-size vector per sequence, read by the next token and written after block l_end.
`RecurrentStateSlot` is the state-only layer that declares it; its attention backend builds vLLM's
ordinary Mamba metadata (which slot each request owns, whether it has an earlier state, where the
prefills start) and keeps the step's whole-batch `CommonAttentionMetadata` beside it, which the middle
block needs to run on part of the batch (`t2mlr.serving.substeps`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    get_temporal_copy_spec,
)
from vllm.v1.attention.backend import AttentionBackend, CommonAttentionMetadata
from vllm.v1.attention.backends.mamba_attn import (
    BaseMambaAttentionMetadata,
    BaseMambaAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import (
    MambaAttentionBackendEnum,
    register_backend,
)

BACKEND_NAME = "T2MLR_STATE"


def register_state_backend() -> None:
    """Add the state backend to vLLM's Mamba backends (once per process; plugins may load twice)."""
    if BACKEND_NAME not in MambaAttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, f"{__name__}.RecurrentStateBackend", is_mamba=True)


def state_backend() -> MambaAttentionBackendEnum:
    register_state_backend()
    return MambaAttentionBackendEnum[BACKEND_NAME]


@dataclass
class RecurrentStateMetadata(BaseMambaAttentionMetadata):
    """vLLM's Mamba metadata plus the step's whole batch (None in a profiling run)."""

    batch: CommonAttentionMetadata | None = None


class RecurrentStateMetadataBuilder(BaseMambaAttentionMetadataBuilder[RecurrentStateMetadata]):
    """The Mamba builder without convolution metadata (R is one vector, there is no convolution)."""

    metadata_cls = RecurrentStateMetadata
    needs_causal_conv1d_metadata = False

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False, **kwargs: Any) -> RecurrentStateMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        return replace(metadata, batch=common_attn_metadata)


class RecurrentStateBackend(AttentionBackend):
    """A state-only backend: no attention kernel, only the metadata of the per-request slots."""

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type:
        raise NotImplementedError("the T²MLR state layer has no attention kernel")

    @staticmethod
    def get_builder_cls() -> type[RecurrentStateMetadataBuilder]:
        return RecurrentStateMetadataBuilder

    @classmethod
    def is_ssm(cls) -> bool:
        return True


def state_dtype(model_dtype: torch.dtype, cache_dtype: str) -> tuple[torch.dtype]:
    """R's dtype: the model's (as `T2MLRCache` keeps it) unless `--mamba-cache-dtype` says otherwise."""
    return MambaStateDtypeCalculator.linear_attention_state_dtype(model_dtype, cache_dtype)


def state_shape(hidden_size: int) -> tuple[tuple[int]]:
    """One slot holds one R: a hidden-size vector (the same on every tensor-parallel rank)."""
    return ((hidden_size,),)


STATE_COPY_FUNCS = (get_temporal_copy_spec,)  # the whole vector moves with its block


class RecurrentStateSlot(MambaBase, nn.Module):
    """The layer that owns R's per-request slots; no weights and no computation of its own.

    After vLLM binds the cache, `states` is a (slots, hidden) view: row `i` is the R of the request that
    owns slot `i`. The model reads and writes rows through the indices in `RecurrentStateMetadata`.
    """

    def __init__(self, hidden_size: int, prefix: str) -> None:
        super().__init__()
        config = get_current_vllm_config()
        self.hidden_size = hidden_size
        self.prefix = prefix
        self.model_dtype = config.model_config.dtype
        self.cache_dtype = config.cache_config.mamba_cache_dtype
        forward_context = config.compilation_config.static_forward_context
        if prefix in forward_context:
            raise ValueError(f"duplicate layer name: {prefix}")
        forward_context[prefix] = self
        self.kv_cache = (torch.tensor([]),)

    @property
    def states(self) -> torch.Tensor:
        return self.kv_cache[0]

    def get_state_shape(self) -> tuple[tuple[int]]:
        return state_shape(self.hidden_size)

    def get_state_dtype(self) -> tuple[torch.dtype]:
        return state_dtype(self.model_dtype, self.cache_dtype)

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return state_backend()

    @property
    def is_kv_cache_tp_replicated(self) -> bool:
        return True
