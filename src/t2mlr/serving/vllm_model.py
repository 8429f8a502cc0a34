"""T²MLR as a vLLM model: vLLM's own decoder layers and attention, R as per-request state.

The model is laid out as the checkpoints this library saves (`t2mlr.model.checkpoint_keys`): the base
decoder's `model.embed_tokens`, `model.layers`, `model.norm` and `lm_head`, built from vLLM's Llama,
Mistral, Qwen2 or Qwen3 decoder layers, plus `model.fusion` (Φ) and `model.cache_norm`, which are the
library's own Φ (`build_fusion`: the variant the config names), `CacheNorm` and cache update
(`StateUpdate`): one implementation of the maths, shared with `T2MLRForCausalLM`. R lives in
`model.recurrent_state[0]` (`t2mlr.serving.state`; see `state_slots` for why there are more of them).

One engine step runs the blocks below l_start once over the whole flattened batch, then the middle block
l_start..l_end, then the blocks above once (docs/semantics.md §5):

* decode tokens (one per request) read their request's R and take one fused step: the whole batch at
  once, with the step's own attention metadata;
* prefill chunks run on the path the engine was started with (`t2mlr.serving.options`): by default
  exactly, position by position across all chunks at once (step s runs the s-th token of every chunk
  that long, and the decode tokens with the first), or by Jacobi iterations over all prefill tokens
  followed by one fused pass of the whole batch.

A chunk starts from the R its request left in its slot (zero for a new or recomputed request, vLLM's
`has_initial_states`), so chunked prefill, preemption and recomputation keep R right; after the chunk,
the slot holds R after its last token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid

from t2mlr.model.checkpoint_keys import current_key
from t2mlr.model.fusion import CacheNorm, StateUpdate, build_fusion

from .checks import check_engine_settings, t2mlr_config
from .jacobi import JacobiIterates
from .options import PrefillChoice
from .state import (
    STATE_COPY_FUNCS,
    RecurrentStateMetadata,
    RecurrentStateSlot,
    state_dtype,
    state_shape,
)
from .substeps import SubBatch, SubBatchAttention

# checkpoint tensors that vLLM's decoder layers hold stacked: (stacked name, part name, shard)
STACKED_PARTS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


def decoder_layer(base_config: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    """vLLM's decoder layer of the backbone's family (the model types `T2MLRConfig` accepts)."""
    model_type = base_config.model_type
    if model_type == "llama":
        from vllm.model_executor.models.llama import LlamaDecoderLayer

        return LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix, config=base_config)
    if model_type == "mistral":
        from vllm.model_executor.models.mistral import MistralDecoderLayer

        return MistralDecoderLayer(vllm_config=vllm_config, prefix=prefix, config=base_config)
    if model_type in ("qwen2", "qwen3"):
        if model_type == "qwen2":
            from vllm.model_executor.models.qwen2 import (
                Qwen2DecoderLayer as layer_class,
            )
        else:
            from vllm.model_executor.models.qwen3 import (
                Qwen3DecoderLayer as layer_class,
            )
        return layer_class(config=base_config, cache_config=vllm_config.cache_config,
                           quant_config=vllm_config.quant_config, prefix=prefix)
    raise ValueError(f"T²MLR serving has no vLLM decoder layer for base model type {model_type!r}; "
                     "supported: llama, mistral, qwen2, qwen3")


@dataclass(frozen=True)
class StepLayout:
    """Where this step's requests sit in the flattened batch (vLLM puts decodes first, then prefills),
    and which state slot each owns. Host tensors, except the slots and the has-a-state flags."""

    num_tokens: int
    num_requests: int
    decode_slots: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_rows: torch.Tensor
    prefill_slots: torch.Tensor
    prefill_has_state: torch.Tensor
    prefill_starts: torch.Tensor
    prefill_lens: torch.Tensor
    prefill_context: torch.Tensor

    @classmethod
    def from_metadata(cls, metadata: RecurrentStateMetadata) -> StepLayout:
        batch = metadata.batch
        if metadata.num_decode_tokens != metadata.num_decodes:
            raise RuntimeError("T²MLR serving runs one token per decode step; speculative decoding is not supported")
        starts = batch.query_start_loc_cpu.long()
        seq_lens = batch.seq_lens_cpu_upper_bound
        seq_lens = (batch.seq_lens.cpu() if seq_lens is None else seq_lens).long()
        num_requests = metadata.num_decodes + metadata.num_prefills
        rows = torch.arange(batch.num_reqs - metadata.num_prefills, batch.num_reqs)
        lens = starts[rows + 1] - starts[rows]
        decode_slots = metadata.state_indices_tensor_d
        return cls(
            num_tokens=metadata.num_decode_tokens + metadata.num_prefill_tokens,
            num_requests=num_requests,
            decode_slots=decode_slots[:, 0].long() if decode_slots is not None else torch.zeros(0, dtype=torch.long),
            decode_seq_lens=seq_lens[: metadata.num_decodes],
            prefill_rows=rows,
            prefill_slots=(metadata.state_indices_tensor_p.long() if metadata.num_prefills
                           else torch.zeros(0, dtype=torch.long)),
            prefill_has_state=(metadata.has_initial_states_p if metadata.num_prefills
                               else torch.zeros(0, dtype=torch.bool)),
            prefill_starts=starts[rows],
            prefill_lens=lens,
            prefill_context=seq_lens[rows] - lens,
        )

    @property
    def num_decodes(self) -> int:
        return len(self.decode_slots)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_rows)

    def position_step(self, s: int) -> SubBatch:
        """Exact prefill, step s: the s-th token of every chunk that long, and (s = 0) every decode token."""
        longer = self.prefill_lens > s
        decodes = torch.arange(self.num_decodes) if s == 0 else torch.zeros(0, dtype=torch.long)
        rows = torch.cat([decodes, self.prefill_rows[longer]])
        return SubBatch(
            rows=rows,
            tokens=torch.cat([decodes, self.prefill_starts[longer] + s]),
            query_lens=torch.ones(len(rows), dtype=torch.long),
            seq_lens=torch.cat([self.decode_seq_lens[decodes], self.prefill_context[longer] + s + 1]),
        )

    def prefill_tokens(self) -> SubBatch:
        """Jacobi prefill: every prefill token, each chunk whole."""
        first = int(self.prefill_starts[0]) if self.num_prefills else self.num_tokens
        return SubBatch(
            rows=self.prefill_rows,
            tokens=torch.arange(first, self.num_tokens),
            query_lens=self.prefill_lens,
            seq_lens=self.prefill_context + self.prefill_lens,
        )

    def is_whole(self, sub: SubBatch) -> bool:
        """Whether a sub-batch is the step's whole batch (then the step's own metadata serves)."""
        return len(sub.rows) == self.num_requests and len(sub.tokens) == self.num_tokens


class T2MLRModel(nn.Module):
    """The backbone: embedding, decoder layers, final norm, the fusion Φ, the cache norm and R's slots."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        super().__init__()
        config = t2mlr_config(vllm_config.model_config.hf_config)
        check_engine_settings(vllm_config)
        base = config.base_config
        self.config = config
        self.prefill = PrefillChoice.from_config(config)
        hidden = base.hidden_size
        eps = getattr(base, "rms_norm_eps", 1e-6)
        self.embed_tokens = VocabParallelEmbedding(base.vocab_size, hidden, quant_config=vllm_config.quant_config,
                                                   prefix=f"{prefix}.embed_tokens")
        self.layers = nn.ModuleList(decoder_layer(base, vllm_config, f"{prefix}.layers.{i}")
                                    for i in range(base.num_hidden_layers))
        self.norm = RMSNorm(hidden, eps=eps)
        self.fusion = build_fusion(config)  # the config's Φ variant (t2mlr.model.fusion)
        self.state_update = StateUpdate.of(config)
        self.cache_norm = CacheNorm(hidden, eps) if self.state_update.normed else None
        self.recurrent_state = state_slots(hidden, base.num_hidden_layers, prefix)
        self.prefix_blocks = range(config.l_start - 1)
        self.middle_blocks = range(config.l_start - 1, config.l_end)
        self.suffix_blocks = range(config.l_end, base.num_hidden_layers)
        self.middle_attention = SubBatchAttention([self.layers[i].self_attn.attn for i in self.middle_blocks],
                                                  vllm_config)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        h_low = self._run_blocks(self.prefix_blocks, positions, hidden)
        h_end = self._middle(h_low, positions)
        hidden = self._run_blocks(self.suffix_blocks, positions, h_end)
        return self.norm(hidden)

    def _run_blocks(self, blocks: range, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Blocks in order; the output is the residual stream (vLLM's layers carry it as two tensors)."""
        residual = None
        for i in blocks:
            hidden, residual = self.layers[i](positions, hidden, residual)
        return hidden if residual is None else hidden + residual

    def _write_state(self, h_end: torch.Tensor, r_read: torch.Tensor) -> torch.Tensor:
        """R after a token: RMSNorm(h + R_prev) by default, the config's update in general (docs/semantics.md §3)."""
        return self.state_update(h_end, r_read, self.cache_norm)

    def _fused_middle(self, h_low: torch.Tensor, r_read: torch.Tensor, positions: torch.Tensor,
                      sub: SubBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One fused pass of the middle block: its output and the R each token writes."""
        with self.middle_attention.running(sub):
            h_end = self._run_blocks(self.middle_blocks, positions, self.fusion(h_low, r_read))
        return h_end, self._write_state(h_end, r_read)

    def _middle(self, h_low: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        metadata = _state_metadata(self.recurrent_state[0].prefix)
        if metadata is None:  # a profiling run: no requests, no state
            return self._fused_middle(h_low, torch.zeros_like(h_low), positions)[0]
        layout = StepLayout.from_metadata(metadata)
        states = self.recurrent_state[0].states
        if layout.num_prefills == 0:
            return self._decode_middle(h_low, positions, layout, states)
        if self.prefill.path == "jacobi":
            return self._jacobi_middle(h_low, positions, layout, states)
        return self._exact_middle(h_low, positions, layout, states)

    def _incoming(self, layout: StepLayout, states: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """R before this step for each request row (decodes, then prefills): its slot, or 0 for a new one."""
        r_decode = states.index_select(0, layout.decode_slots.to(states.device)).to(like.dtype)
        r_prefill = states.index_select(0, layout.prefill_slots.to(states.device)).to(like.dtype)
        r_prefill = torch.where(layout.prefill_has_state.to(like.device)[:, None], r_prefill,
                                torch.zeros_like(r_prefill))
        return torch.cat([r_decode, r_prefill])

    def _store(self, states: torch.Tensor, layout: StepLayout, r_rows: torch.Tensor) -> None:
        """R after each request's last token into its slot."""
        slots = torch.cat([layout.decode_slots, layout.prefill_slots]).to(states.device)
        states.index_copy_(0, slots, r_rows.to(states.dtype))

    def _decode_middle(self, h_low: torch.Tensor, positions: torch.Tensor, layout: StepLayout,
                       states: torch.Tensor) -> torch.Tensor:
        """Decode only: one fused step for the whole batch, with the step's own attention metadata."""
        r_read = torch.zeros_like(h_low)
        r_read[: layout.num_decodes] = self._incoming(layout, states, h_low)
        h_end, r_out = self._fused_middle(h_low, r_read, positions)
        self._store(states, layout, r_out[: layout.num_decodes])
        return h_end

    def _exact_middle(self, h_low: torch.Tensor, positions: torch.Tensor, layout: StepLayout,
                      states: torch.Tensor) -> torch.Tensor:
        """Exact prefill: position s of every chunk at step s, each token reading the R its predecessor
        wrote (the decode tokens join step 0). The keys each step writes are the ones the next attends to."""
        r_rows = self._incoming(layout, states, h_low)
        h_end = h_low.clone()
        for s in range(int(layout.prefill_lens.max())):
            sub = layout.position_step(s)
            rows, tokens = sub.rows.to(h_low.device), sub.tokens.to(h_low.device)
            out, r_out = self._fused_middle(h_low.index_select(0, tokens), r_rows.index_select(0, rows),
                                            positions.index_select(0, tokens), None if layout.is_whole(sub) else sub)
            h_end.index_copy_(0, tokens, out)
            r_rows.index_copy_(0, rows, r_out)
        self._store(states, layout, r_rows)
        return h_end

    def _jacobi_middle(self, h_low: torch.Tensor, positions: torch.Tensor, layout: StepLayout,
                       states: torch.Tensor) -> torch.Tensor:
        """Jacobi prefill (docs/semantics.md §5.2), then one fused pass of the whole batch: the decode tokens
        read their slots, the prefill tokens the last iterate."""
        r_rows = self._incoming(layout, states, h_low)
        sub = layout.prefill_tokens()
        tokens = sub.tokens.to(h_low.device)
        iterates = JacobiIterates(sub.query_lens, r_rows[layout.num_decodes:], h_low.device)
        h_sub, pos_sub = h_low.index_select(0, tokens), positions.index_select(0, tokens)
        attend = None if layout.is_whole(sub) else sub
        r_read = iterates.start()
        for k in range(1, self.prefill.depth + 1):
            if k == 1:  # the seed: the middle block without fusion
                with self.middle_attention.running(attend):
                    h_seed = self._run_blocks(self.middle_blocks, pos_sub, h_sub)
                r_next = iterates.shifted(self._write_state(h_seed, r_read))
            else:
                r_next = iterates.shifted(self._fused_middle(h_sub, r_read, pos_sub, attend)[1])
            r_read = iterates.advance(k, r_read, r_next, self.prefill.depth, self.prefill.tol)
            if iterates.finished(k):
                break
        r_all = torch.zeros_like(h_low)
        r_all[: layout.num_decodes] = r_rows[: layout.num_decodes]
        r_all.index_copy_(0, tokens, r_read)
        h_end, r_out = self._fused_middle(h_low, r_all, positions)
        last = torch.cat([torch.arange(layout.num_decodes), layout.prefill_starts + layout.prefill_lens - 1])
        self._store(states, layout, r_out.index_select(0, last.to(h_low.device)))
        return h_end


def state_slots(hidden: int, num_blocks: int, prefix: str) -> nn.ModuleList:
    """R's slot layer, and as many more as the model has attention layers, unused.

    vLLM's hybrid allocator splits the layers of each kind into KV-cache groups of equal size, the size being
    the smaller kind's count: one state layer would put every attention layer in a group of its own, and each
    group costs block-table, slot-mapping and metadata work at every step (measured: about 5 ms of a 60 ms
    SmolLM2-135M decode step on the CPU). With as many state layers as attention layers there are two groups,
    at the price of one KV block per request for the state (block-size tokens' worth of keys and values).
    Each name holds one integer, past the blocks' (vLLM orders cache layers by it)."""
    return nn.ModuleList(RecurrentStateSlot(hidden, prefix=f"{prefix}.recurrent_state.{num_blocks + i}")
                         for i in range(num_blocks))


def _state_metadata(prefix: str) -> RecurrentStateMetadata | None:
    """This step's metadata of R's slots; None when there is none (profiling and warm-up runs)."""
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):
        metadata = metadata[0] if metadata else None
    if not isinstance(metadata, dict):
        return None
    found = metadata.get(prefix)
    return found if isinstance(found, RecurrentStateMetadata) and found.batch is not None else None


class T2MLRVllmForCausalLM(nn.Module, HasInnerState, IsHybrid):
    """vLLM's `T2MLRForCausalLM`: the backbone and the LM head, loading this library's checkpoints."""

    is_hybrid: ClassVar[Literal[True]] = True
    has_inner_state: ClassVar[Literal[True]] = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = t2mlr_config(vllm_config.model_config.hf_config)
        base = config.base_config
        self.config = config
        self.model = T2MLRModel(vllm_config=vllm_config, prefix=_joined(prefix, "model"))
        self.lm_head = ParallelLMHead(base.vocab_size, base.hidden_size, quant_config=vllm_config.quant_config,
                                      prefix=_joined(prefix, "lm_head"))
        self.tied = bool(getattr(base, "tie_word_embeddings", False))
        if self.tied:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(base.vocab_size)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int]]:
        config = t2mlr_config(vllm_config.model_config.hf_config)
        return state_shape(config.base_config.hidden_size)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype]:
        return state_dtype(vllm_config.model_config.dtype, vllm_config.cache_config.mamba_cache_dtype)

    @classmethod
    def get_mamba_state_copy_func(cls) -> tuple:
        return STATE_COPY_FUNCS

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a checkpoint of this library, in today's tensor names or 0.1's (`current_key`)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for saved_name, tensor in weights:
            name = current_key(saved_name)
            if "rotary_emb.inv_freq" in name or (self.tied and name == "lm_head.weight"):
                continue
            name, shard = _stacked(name)
            if name not in params:
                raise ValueError(f"unexpected tensor {saved_name!r} in the checkpoint: not a T²MLR checkpoint of "
                                 f"this config ({self.config.base_config.model_type} backbone, "
                                 f"T²MLR({self.config.l_start},{self.config.l_end}))")
            param = params[name]
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                weight_loader(param, tensor)
            else:
                weight_loader(param, tensor, shard)
            loaded.add(name)
        return loaded


def _stacked(name: str) -> tuple[str, str | int | None]:
    """A checkpoint name as vLLM's parameter name, with the shard it fills in a stacked parameter."""
    for stacked, part, shard in STACKED_PARTS:
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{stacked}."), shard
    return name, None


def _joined(prefix: str, name: str) -> str:
    return name if not prefix else f"{prefix}.{name}"
