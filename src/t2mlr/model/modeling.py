"""`T2MLRModel` and `T2MLRForCausalLM`: a Hugging Face decoder with temporal middle-layer recurrence.

Laid out as every transformers causal LM: `T2MLRForCausalLM` is the backbone `T2MLRModel` (under `model.`)
plus the LM head. The backbone holds the base decoder's own embedding, decoder blocks, rotary embedding
and final norm (`t2mlr.model.wrapping`), decides in which order its blocks run, and inserts the fusion Φ
before block l_start and the cache update after block l_end (docs/semantics.md). It returns the hidden
states after the final norm, so tools that score tokens through `model.base_model` (TRL) see a backbone
like `LlamaModel`.

A forward reads prefix → middle → suffix. The prefix (blocks below l_start) and the suffix (blocks
above l_end, norm) run once, in parallel over the chunk. The middle block l_start..l_end runs on one of
three paths:

* exact: token by token, R carried from token to token (the definition; also the decode step).
* jacobi: a seed pass without fusion, then fused refinements of the whole chunk's R at once, then a
  final pass; the detached iterations run in a no-grad loop, the last d_backward in a gradient loop.
  The middle block runs d_forward + 1 times, everything else once. Started from exact states
  (`exact_states=True`: a rollout's, or the exact path's own under a BPTT window) it runs once, and its
  backward is that of d_backward iterates at the fixed point (`fixed_point.FixedPointBackward`).
* off: the base model unchanged (no fusion, no cache update).

R has one name per role: `r_in` is R before the chunk (from the cache, or R_0 = 0), `r_read` is what
each token reads (R_{t-1}, zero at a document start), `r_out` is what each token writes (R_t).
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils.generic import can_return_tuple

from t2mlr.utils import caller_stacklevel, check_known_names

from . import checks
from .cache import T2MLRCache, T2MLRStaticCache
from .configuration import ForwardPath, T2MLRConfig
from .fixed_point import FixedPointBackward
from .fusion import CacheNorm, Fusion, StateUpdate, build_fusion, check_retrofit_fusion
from .generation import T2MLRGenerationMixin
from .layout import (
    LayerInputs,
    TokenLayout,
    chunk_kv_offset,
    gather_states,
    latest_real_index,
    reset_at_starts,
    rows_mask,
    states_read,
)
from .pretrained import load_pretrained_base
from .remote_code import write_remote_code_modules
from .wrapping import (
    AttentionRecorder,
    DecoderBackbone,
    LMHeadOverBackbone,
    RunsBaseDecoder,
    base_decoder,
    call_block,
    checkpoint_blocks,
    checkpoints_reentrantly,
    decoder_configs,
    follow_placement,
)


@dataclass
class T2MLRModelOutput(BaseModelOutputWithPast):
    """`BaseModelOutputWithPast` (last_hidden_state after the final norm) plus the recurrence's outputs.

    recurrent_state: R after the last token of each row, (batch, hidden); None on the "off" path.
    jacobi_iterations: cache iterates computed by the Jacobi path (fewer than d_forward when the
        early stop fired); None on the other paths. A 0-d tensor when the early stop ran under
        torch.compile (the count is known only on the device there).
    """

    recurrent_state: torch.Tensor | None = None
    jacobi_iterations: int | torch.Tensor | None = None
    exact_solve: "ExactSolveReport | None" = None


@dataclass
class T2MLRCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the recurrence's own outputs (see `T2MLRModelOutput`)."""

    recurrent_state: torch.Tensor | None = None
    jacobi_iterations: int | torch.Tensor | None = None
    exact_solve: "ExactSolveReport | None" = None


@dataclass
class ExactSolveReport:
    """How one exact forward solved R: which solver ran and, for the fixed-point solver, per chunk of tokens
    its start, its length, the fused passes it took (after one seed pass) and how many of its tokens the
    sequential step finished after the cap (0: the chunk settled within the tolerance, or was exact)."""

    solver: str  # "sequential" or "fixed_point" (what ran, "auto" resolved)
    tol: float | None = None
    starts: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)
    sequential_tokens: list[int] = field(default_factory=list)

    def add_chunk(self, start: int, length: int, passes: int, sequential_tokens: int) -> None:
        self.starts.append(start)
        self.lengths.append(length)
        self.passes.append(passes)
        self.sequential_tokens.append(sequential_tokens)

    def fallbacks(self) -> int:
        """Chunks the fixed-point passes left unsettled at the cap (the sequential step finished them)."""
        return sum(passes > 0 and tokens > 0 for passes, tokens in zip(self.passes, self.sequential_tokens))

    @staticmethod
    def combined(reports: Sequence["ExactSolveReport | None"]) -> dict[str, Any] | None:
        """One result's totals over many forwards (an evaluation's batches): the solvers that ran, the spans,
        the mean and largest fused passes per span, the spans fallen back. None when the fixed-point solver
        never ran (no exact forward, or only the sequential loop: the path's description names that)."""
        known = [report for report in reports if report is not None]
        if all(report.solver == "sequential" for report in known):
            return None
        passes = [p for report in known for p in report.passes if p > 0]
        return {
            "solvers": sorted({report.solver for report in known}),
            "forwards": len(known),
            "chunks": sum(len(report.starts) for report in known),
            "mean_passes": sum(passes) / len(passes) if passes else None,
            "max_passes": max(passes, default=None),
            "fallback_chunks": sum(report.fallbacks() for report in known),
            "sequential_tokens": sum(sum(report.sequential_tokens) for report in known),
        }

    def summary(self) -> dict[str, Any]:
        """JSON-ready totals for a result file: the solver, its chunks, passes, fallbacks and sequential work."""
        return {
            "solver": self.solver,
            "tol": self.tol,
            "chunks": len(self.starts),
            "passes": list(self.passes),
            "fallback_chunks": self.fallbacks(),
            "sequential_chunks": sum(passes == 0 for passes in self.passes),
            "sequential_tokens": sum(self.sequential_tokens),
        }


class T2MLRPreTrainedModel(RunsBaseDecoder, PreTrainedModel):
    config_class = T2MLRConfig
    base_model_prefix = "model"
    _can_compile_fullgraph = True  # a step with a static cache is one graph (tests/test_compile.py)
    # R runs through every token of a row: a row split over devices by context parallelism would drop it
    _supports_context_parallel = False

    def _init_weights(self, module: nn.Module) -> None:
        """The fusion's linears ~ N(0, initializer_range × gate_init_scale) with γ = 0 (each variant's own
        start, `Fusion.reset_parameters`), the cache norm's gain 1; every other module as transformers
        initialises the base decoder's (its config's range)."""
        if isinstance(module, Fusion):
            std = getattr(self.config.base_config, "initializer_range", 0.02) * self.config.gate_init_scale
            module.reset_parameters(std)
        elif isinstance(module, CacheNorm):
            nn.init.ones_(module.weight)
        else:
            super()._init_weights(module)

    def forward_path(self, recurrence: str | None = None, **overrides: Any) -> ForwardPath:
        """The path a call with these arguments takes in the current train/eval mode (see T2MLRConfig)."""
        return self.config.forward_path(self.training, recurrence, **overrides)


@dataclass(frozen=True)
class PreparedChunk:
    """One forward's chunk as every path of the middle block reads it, prepared once before any block runs: the
    blocks' inputs (positions, masks, the KV cache), the token layout (real tokens, document starts), how many
    tokens the cache held before (where R is read from), which tokens fuse R, the states a caller gives
    (`initial_states`, `exact_states`) and where block outputs are recorded when hidden states are asked for."""

    inputs: LayerInputs
    layout: TokenLayout
    past: int | torch.Tensor
    recurrence_mask: torch.Tensor | None = None
    initial_states: torch.Tensor | None = None
    exact_states: bool = False
    record: list | None = None


@dataclass
class ExactChunk:
    """What the exact path's solvers share over one forward's chunk, beside the prepared chunk itself: the middle
    block's input, the KV cache its keys go to (with each middle layer's first key column in the chunk's masks),
    and where per-layer outputs are collected when hidden states are asked for."""

    h_low: torch.Tensor
    prepared: PreparedChunk
    cache: DynamicCache
    offsets: dict[int, int]
    per_layer: dict[int, list[torch.Tensor]] | None

    def mask(self, layer: int, rows: slice) -> Any:
        """Layer `layer`'s mask for the chunk's tokens `rows`, against the keys its cache holds once they are written."""
        return rows_mask(self.prepared.inputs.masks[layer], rows, self.cache, layer, self.offsets[layer])

    def span_inputs(self, rows: slice) -> LayerInputs:
        """The middle blocks' inputs for the chunk's tokens `rows` run at once, writing to the chunk's cache (the
        other blocks' masks are left out: they do not run on a span)."""
        inputs = self.prepared.inputs
        cos, sin = inputs.position_embeddings
        return replace(
            inputs,
            masks=[self.mask(i, rows) if i in self.offsets else None for i in range(len(inputs.masks))],
            position_ids=inputs.position_ids[:, rows],
            position_embeddings=(cos[:, rows], sin[:, rows]),
            cache=self.cache,
        )

    def record(self, layer: int, hidden: torch.Tensor) -> None:
        if self.per_layer is not None:
            self.per_layer[layer].append(hidden)


def is_t2mlr(model: nn.Module) -> bool:
    """The one test of "is this a T²MLR causal LM" (a wrapper such as DDP must be unwrapped first)."""
    return isinstance(model, T2MLRForCausalLM)


class T2MLRModel(DecoderBackbone, T2MLRPreTrainedModel):
    """The T²MLR backbone: the base decoder's parts, the fusion Φ and the cache norm. See the module docstring."""

    def __init__(self, config: T2MLRConfig, decoder: nn.Module | None = None) -> None:
        """`decoder`: the base decoder's inner model (e.g. a `LlamaModel`) whose parts become this model's;
        None builds a fresh one from `config.base_config`."""
        config.validate_recurrence()  # first: PreTrainedModel.__init__ reads the base config it needs
        super().__init__(config)
        self.adopt_decoder_parts(decoder)
        d = config.hidden_size
        self.fusion = build_fusion(config)
        self.state_update = StateUpdate.of(config)
        self.recurrent_weight: float | None = None  # a training curriculum's λ: Φ reads λ·R (None: R)
        eps = getattr(config.base_config, "rms_norm_eps", 1e-6)
        self.cache_norm = CacheNorm(d, eps) if self.state_update.normed else None
        self.post_init()
        follow_placement(self.embed_tokens.weight, (self.fusion, self.cache_norm))

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

    def builds_cache(self, use_cache: bool | None) -> bool:
        """Whether a forward given no cache starts one (and returns it, for the next chunk to continue).
        `use_cache=None` follows the config's `use_cache` in evaluation mode, as `LlamaModel` does; in
        training mode it means no cache: a training step reads none back, and keeping one would cost a
        copy of every block's keys and values. Under torch.compile it means none either: a growing cache
        does not trace (a compiled step is given its cache, as `generate()` gives a static one)."""
        if use_cache is None:
            use_cache = not self.training and not torch.compiler.is_compiling() and default_use_cache(self.config)
        return bool(use_cache)

    # ----------------------------------------------------------------------------- forward
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: T2MLRCache | T2MLRStaticCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        recurrence: str | None = None,
        d_forward: int | None = None,
        d_backward: int | None = None,
        jacobi_tol: float | None = None,
        recurrence_mask: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        exact_states: bool = False,
        bptt_window: int | None = None,
        exact_solver: str | None = None,
        fixed_point_tol: float | None = None,
        fixed_point_chunk: int | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> T2MLRModelOutput:
        """The backbone's forward: the hidden states after the final norm (`last_hidden_state`).

        `recurrence` picks the path ("exact", "jacobi", "off"; None = the config's path for the current
        train/eval mode); `d_forward`, `d_backward`, `jacobi_tol`, `bptt_window`, `exact_solver`,
        `fixed_point_tol` and `fixed_point_chunk` override the config's settings for this call (each is
        used by its path only; the exact path's solver: `resolved_solver`, docs/model.md).

        `initial_states` (batch, seq, hidden): R after every token of the chunk, e.g. the exact states a
        rollout computed (`generate(..., output_recurrent_states=True)`); the Jacobi path starts from them
        instead of the seed pass, so with exact states every d_forward >= 1 gives the exact forward.
        `exact_states=True` says they are exact (the fixed point): the middle block then runs once, and its
        backward is exactly that of d_backward gradient-carrying iterates (`t2mlr.model.fixed_point`), at
        about half their cost (d = 4: 7 block-forward equivalents against 15); d_forward does not matter.
        With states that are not exact (stale ones from an earlier epoch) leave it False: the iterates then
        move, and only the iterated path is right.
        `output_hidden_states=True` returns every block's output in transformers' convention
        (embeddings, blocks 1..L-1, the final norm of block L), on every path. `output_attentions=True`
        (eager attention only) returns every block's attention weights, (batch, heads, chunk, keys): the
        middle blocks' are the exact path's token rows assembled into one matrix, or the Jacobi path's final
        pass (docs/semantics.md §5.5). Both default to the config's fields, as in transformers. Other
        keyword arguments transformers' tools pass to a backbone (TRL's `logits_to_keep`) are accepted and
        unused, as `LlamaModel` does. `use_cache`: see `builds_cache`."""
        checks.check_no_misspelt_arguments(kwargs, FORWARD_ARGUMENTS)
        attentions_wanted = self.config.output_attentions if output_attentions is None else output_attentions
        if attentions_wanted:
            checks.check_attention_weights_available(c._attn_implementation for c in decoder_configs(self))
        path = self.forward_path(
            recurrence, d_forward=d_forward, d_backward=d_backward, jacobi_tol=jacobi_tol, bptt_window=bptt_window,
            exact_solver=exact_solver, fixed_point_tol=fixed_point_tol, fixed_point_chunk=fixed_point_chunk,
        )
        checks.check_block_count(self.layers, self.config.num_layers)
        if self.training and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            checks.check_gates_pass_gradients(self.fusion)
        cache = checks.checked_cache(past_key_values, use_cache)
        if cache is None and self.builds_cache(use_cache):
            cache = T2MLRCache(config=self.config.base_config)
        past = checks.cached_length(cache)
        layout, attention_mask = checks.checked_chunk(
            input_ids, inputs_embeds, attention_mask, position_ids, cache, self.config.hidden_size,
            self.config.vocab_size, checks.position_limit(self.config.base_config), document_ids,
            reads_states=path.recurrence != "off",
        )
        batch, length = layout.real.shape
        recurrence_mask = checks.checked_recurrence_mask(recurrence_mask, self.config.recurrence_mask_policy, batch, length)
        initial_states = checks.checked_initial_states(
            initial_states, path.recurrence, batch, length, self.config.hidden_size, exact_states
        )
        path = self.resolved_solver(path, length, cache, attentions_wanted, fixed_point_chunk is not None)
        hidden = inputs_embeds if input_ids is None else self.embed_tokens(input_ids)
        inputs = self.chunk_inputs(hidden, attention_mask, layout, cache, full_masks=path.exact_solver != "sequential")
        wanted = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        record = [hidden] if wanted else None

        chunk = PreparedChunk(inputs, layout, past, recurrence_mask, initial_states, exact_states, record)

        with AttentionRecorder(self.layers) if attentions_wanted else nullcontext() as attentions:
            hidden = self._run_layers(self.prefix_layer_indices(), hidden, inputs, record)
            hidden, r_out, iterations, solve = self._middle(path, hidden, chunk)
            hidden = self.norm(self._run_layers(self.suffix_layer_indices(), hidden, inputs, record))
        if record is not None:
            record[-1] = hidden  # transformers' convention: the last entry is normed
        return T2MLRModelOutput(
            last_hidden_state=hidden,
            past_key_values=cache,
            hidden_states=None if record is None else tuple(record),
            attentions=None if attentions is None else attentions.weights(length, past),
            recurrent_state=None if r_out is None else _last_state(r_out),
            jacobi_iterations=iterations,
            exact_solve=solve,
        )

    def _run_layers(
        self, indices: Sequence[int], hidden: torch.Tensor, inputs: LayerInputs, record: list | None = None
    ) -> torch.Tensor:
        for i in indices:
            hidden = self.run_block(i, hidden, inputs)
            if record is not None:
                record.append(hidden)
        return hidden

    def _middle(
        self, path: ForwardPath, h_low: torch.Tensor, chunk: PreparedChunk
    ) -> tuple[torch.Tensor, torch.Tensor | None, int | torch.Tensor | None, ExactSolveReport | None]:
        """Blocks l_start..l_end on the chosen path: their output, R after each token, Jacobi iterates, and
        how the exact path solved R. Every path reads R_in, the state the cache holds before the chunk."""
        if path.recurrence == "off":
            return self._run_layers(self.middle_layer_indices(), h_low, chunk.inputs, chunk.record), None, None, None
        cache = chunk.inputs.cache
        zero = h_low.new_zeros(h_low.shape[0], self.config.hidden_size)
        r_in = zero if cache is None else cache.incoming_state(chunk.past, h_low)
        iterations, solve = None, None
        if path.recurrence == "exact" and path.bptt_window is not None and torch.is_grad_enabled():
            h_end, r_out, solve = self._truncated_exact_middle(h_low, r_in, chunk, path)
        elif path.recurrence == "exact" or h_low.shape[1] == 1:  # one token: the Jacobi fixed point at once
            h_end, r_out, solve = self._solved_exact_middle(h_low, r_in, chunk, path)
        elif chunk.past > 0:
            raise ValueError(
                "Jacobi over a multi-token chunk needs an empty cache (it is a prefill); continue a "
                "cached sequence with recurrence='exact' or one token at a time"
            )
        elif chunk.exact_states:
            h_end, r_out = self._replayed_middle(h_low, r_in, chunk, path.d_backward, chunk.initial_states)
            iterations = path.d_backward
        else:
            h_end, r_out, iterations = self._jacobi_middle(h_low, r_in, chunk, path)
        if cache is not None:
            cache.append_recurrent_states(r_out)
        return h_end, r_out, iterations, solve

    # ----------------------------------------------------------------------------- fusion and update
    def _fuse(self, h: torch.Tensor, r_read: torch.Tensor, recurrence_mask: torch.Tensor | None) -> torch.Tensor:
        if self.recurrent_weight is not None:  # set by the trainer's recurrent-weight curriculum only
            r_read = r_read * self.recurrent_weight
        fused = self.fusion(h, r_read)
        if recurrence_mask is None:
            return fused
        return torch.where(recurrence_mask[..., None], fused, h)

    def _write_state(self, h_end: torch.Tensor, r_read: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """R after a token: the cache update for real tokens; padding passes R through unchanged."""
        updated = self.state_update(h_end, r_read, self.cache_norm)
        return torch.where(real[..., None], updated, r_read)

    # ----------------------------------------------------------------------------- exact path
    def resolved_solver(
        self, path: ForwardPath, length: int, cache: Any, attentions_wanted: bool, chunk_given: bool = False
    ) -> ForwardPath:
        """The exact path's solver for a chunk of `length` tokens: "sequential", or "fixed_point" / "auto" where
        the fixed-point solver can run ("auto" becomes "sequential" where it cannot). A one-token chunk (a
        decode step) is always the sequential step. An explicit "fixed_point" that cannot run here, or an
        explicit chunk longer than the forward's, is refused before compute rather than replaced."""
        if path.recurrence != "exact" or path.exact_solver == "sequential" or length == 1:
            return replace(path, exact_solver="sequential")
        if chunk_given and path.fixed_point_chunk > length:
            raise ValueError(
                f"fixed_point_chunk={path.fixed_point_chunk} is longer than this forward's {length} tokens: give at most "
                f"{length}, or leave it to the config (fixed_point_chunk there is an upper bound)"
            )
        obstacle = self._fixed_point_obstacle(path, cache, attentions_wanted)
        if obstacle is None:
            return path
        if path.exact_solver == "fixed_point":
            raise ValueError(
                f"exact_solver='fixed_point' cannot run this forward: {obstacle}. Use exact_solver='auto' (the "
                "sequential step where fixed_point cannot run) or 'sequential'"
            )
        return replace(path, exact_solver="sequential")

    def _fixed_point_obstacle(self, path: ForwardPath, cache: Any, attentions_wanted: bool) -> str | None:
        """Why the fixed-point solver cannot run this forward (None: it can). Its passes attend to the keys of
        earlier chunks through the KV cache and take back what they wrote, so the cache must be a growing one."""
        if torch.compiler.is_compiling():
            return "a traced forward cannot stop on the tolerance, which is read on the host"
        if torch.is_grad_enabled() and path.bptt_window is None:
            return ("it solves R without gradients, and the loss would need them through every token: run under "
                    "torch.no_grad(), or train with bptt_window=k (the replay then starts from its states)")
        if attentions_wanted:
            return "output_attentions=True returns the sequential loop's attention rows"
        if isinstance(cache, T2MLRStaticCache):
            return "a static cache writes keys in place, so a pass cannot be taken back; use the default T2MLRCache"
        if cache is not None and any(getattr(cache.layers[i], "is_sliding", False)
                                     for i in self.middle_layer_indices() if i < len(cache.layers)):
            return "the middle blocks' sliding-window cache drops keys that a pass cannot restore"
        unsupported = {c._attn_implementation for c in decoder_configs(self)} - {"eager", "sdpa"}
        if unsupported:
            return f"it needs 'eager' or 'sdpa' attention (4D masks), not {sorted(unsupported)}"
        return None

    def _solved_exact_middle(
        self, h_low: torch.Tensor, r_in: torch.Tensor, prepared: PreparedChunk, path: ForwardPath
    ) -> tuple[torch.Tensor, torch.Tensor, ExactSolveReport]:
        """The exact path: the middle block's outputs and R after each token, solved by `path.exact_solver`.

        Both solvers write the chunk's middle-block keys into the KV cache (a local one when the forward
        keeps none). "sequential" runs the token loop. "fixed_point" splits the chunk into spans of at most
        `fixed_point_chunk` tokens and settles each by Jacobi passes over the span (`_settle_span`),
        attending to the earlier spans' keys in the cache; under "auto", once a span has fallen back to the
        sequential step, the rest of the chunk runs sequentially (the model's R does not settle fast)."""
        middle, inputs, record = self.middle_layer_indices(), prepared.inputs, prepared.record
        chunk = ExactChunk(
            h_low, prepared,
            cache=inputs.cache if inputs.cache is not None else DynamicCache(),
            offsets={i: chunk_kv_offset(inputs.cache, i) for i in middle},
            per_layer={i: [] for i in middle} if record is not None else None,
        )
        length = h_low.shape[1]
        if path.exact_solver == "sequential":
            report = ExactSolveReport("sequential")
            spans = [range(length)]
        else:
            report = ExactSolveReport("fixed_point", tol=path.fixed_point_tol)
            size = min(path.fixed_point_chunk, length)
            spans = [range(a, min(a + size, length)) for a in range(0, length, size)]
        outputs, states, r_prev, settling = [], [], r_in, path.exact_solver != "sequential"
        for rows in spans:
            if settling and len(rows) > 1:
                h_end, r_out, passes, fallback = self._settle_span(chunk, r_prev, rows, path)
                report.add_chunk(rows.start, len(rows), passes, fallback)
                settling = fallback == 0 or path.exact_solver == "fixed_point"
            else:
                h_end, r_out = self._exact_rows(chunk, r_prev, rows)
                if report.solver == "fixed_point":
                    report.add_chunk(rows.start, len(rows), 0, len(rows))
            outputs.append(h_end)
            states.append(r_out)
            r_prev = r_out[:, -1]
        if chunk.per_layer is not None:
            record.extend(torch.cat(chunk.per_layer[i], dim=1) for i in middle)
        if report.fallbacks():
            _warn_fallback(report, path)
        return torch.cat(outputs, dim=1), torch.cat(states, dim=1), report

    def _exact_rows(self, chunk: "ExactChunk", r_prev: torch.Tensor, rows: range) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequential step over tokens `rows` of the chunk, from R = `r_prev` before the first: each token
        reads R, runs the middle block with the KV cache, writes R. Returns the outputs and R after each."""
        inputs, layout, recurrence_mask = chunk.prepared.inputs, chunk.prepared.layout, chunk.prepared.recurrence_mask
        decode_step = chunk.h_low.shape[1] == 1  # the chunk's own masks are already the step's masks
        cos, sin = inputs.position_embeddings
        outputs, r_out = [], []
        for t in rows:
            r_read = reset_at_starts(r_prev, layout.document_start[:, t])
            token_mask = None if recurrence_mask is None else recurrence_mask[:, t : t + 1]
            hidden = self._fuse(chunk.h_low[:, t : t + 1], r_read[:, None], token_mask)
            for i in self.middle_layer_indices():
                hidden = call_block(
                    self.layers[i],
                    hidden,
                    attention_mask=inputs.masks[i] if decode_step else chunk.mask(i, slice(t, t + 1)),
                    position_ids=inputs.position_ids[:, t : t + 1],
                    past_key_values=chunk.cache,
                    use_cache=True,
                    position_embeddings=(cos[:, t : t + 1], sin[:, t : t + 1]),
                )
                chunk.record(i, hidden)
            r_prev = self._write_state(hidden[:, 0], r_read, layout.real[:, t])
            outputs.append(hidden)
            r_out.append(r_prev)
        return torch.cat(outputs, dim=1), torch.stack(r_out, dim=1)

    def _settle_span(
        self, chunk: "ExactChunk", r_prev: torch.Tensor, rows: range, path: ForwardPath
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Tokens `rows` by Jacobi passes over the whole span: a seed pass (no fusion), then fused passes
        until what every token reads moves by at most `fixed_point_tol` between two passes. Each pass
        attends to the earlier spans' keys in the cache and its own keys are taken back before the next.

        Fused pass k reads exact states at the span's first k tokens (a token's read depends on the tokens
        before it only), so it is exact there: a span is exact after as many fused passes as it has tokens.
        A span that has not settled after `fixed_point_cap` passes keeps that pass's exact first tokens and
        the sequential step finishes the rest. Returns the outputs, R after each token, the fused passes
        taken and how many tokens the sequential step ran (0: settled)."""
        span = slice(rows.start, rows.stop)
        size, middle, cache, layout = len(rows), self.middle_layer_indices(), chunk.cache, chunk.prepared.layout
        h_span, real, starts = chunk.h_low[:, span], layout.real[:, span], layout.document_start[:, span]
        recurrence_mask = chunk.prepared.recurrence_mask
        span_mask = None if recurrence_mask is None else recurrence_mask[:, span]
        latest_real = latest_real_index(real)
        inputs = chunk.span_inputs(span)

        def one_pass(r_read: torch.Tensor, fuse: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
            layer_outputs: list[torch.Tensor] = []
            hidden = self._run_layers(middle, self._fuse(h_span, r_read, span_mask) if fuse else h_span, inputs,
                                      layer_outputs)
            return hidden, self._write_state(hidden, r_read, real), layer_outputs

        def take_back(tokens: int) -> None:
            for i in middle:
                cache.layers[i].crop(-tokens)

        r_read = states_read(torch.zeros_like(h_span), r_prev, latest_real, starts)
        _, written, _ = one_pass(r_read, fuse=False)
        take_back(size)
        r_read = states_read(written, r_prev, latest_real, starts)
        passes = 0
        while True:
            h_end, written, layer_outputs = one_pass(r_read, fuse=True)
            passes += 1
            r_next = states_read(written, r_prev, latest_real, starts)
            settled = passes == size or float((r_next - r_read).abs().max()) <= path.fixed_point_tol
            if settled or passes == path.fixed_point_cap:
                break
            take_back(size)
            r_read = r_next
        r_out = gather_states(written, r_prev, latest_real)
        exact = size if settled else passes  # tokens this pass computed exactly (or within the tolerance)
        for i, hidden in zip(middle, layer_outputs):
            chunk.record(i, hidden[:, :exact])
        if settled:
            return h_end, r_out, passes, 0
        take_back(size - exact)
        rest = range(rows.start + exact, rows.stop)
        h_rest, r_rest = self._exact_rows(chunk, r_out[:, exact - 1], rest)
        return (torch.cat([h_end[:, :exact], h_rest], dim=1), torch.cat([r_out[:, :exact], r_rest], dim=1),
                passes, len(rest))

    def _truncated_exact_middle(
        self, h_low: torch.Tensor, r_in: torch.Tensor, chunk: PreparedChunk, path: ForwardPath
    ) -> tuple[torch.Tensor, torch.Tensor, ExactSolveReport]:
        """The exact path with truncated backpropagation through time (docs/semantics.md §5.1).

        The exact states come from the exact path's solver without gradients (and without the chunk's
        cache, which the replay fills); then they are replayed (`_replayed_middle`): one fused pass over the
        whole chunk whose backward is that of `bptt_window` Jacobi iterates at the fixed point. The values
        are the exact path's, and the loss at token t reaches back through R to tokens t-1 .. t-bptt_window
        only (window 1: R detached after every token)."""
        if chunk.past > 0:
            raise ValueError(
                "bptt_window applies to a chunk that starts its sequence, not to one continuing a cache: "
                "continue it under torch.no_grad(), or pass bptt_window=None"
            )
        with torch.no_grad():  # detached: a view of a graph tensor made under no_grad still requires grad
            solving = replace(chunk, inputs=chunk.inputs.without_cache(), record=None)
            _, exact_states, report = self._solved_exact_middle(h_low.detach(), r_in, solving, path)
        h_end, r_out = self._replayed_middle(h_low, r_in, chunk, path.bptt_window, exact_states)
        return h_end, r_out, report

    def _replayed_middle(
        self, h_low: torch.Tensor, r_in: torch.Tensor, chunk: PreparedChunk, depth: int, states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay from exact states: one fused pass of the middle block reading them; with gradients on, its
        backward is that of `depth` Jacobi iterates at this fixed point (`FixedPointBackward`)."""
        if torch.is_grad_enabled():
            self._check_replay_checkpointing()
        layout = chunk.layout
        latest_real = latest_real_index(layout.real)
        r_given = states.to(h_low.dtype).detach().requires_grad_(torch.is_grad_enabled())
        r_read = states_read(r_given, r_in, latest_real, layout.document_start)
        fused = self._fuse(h_low, r_read, chunk.recurrence_mask)
        h_end = self._run_layers(self.middle_layer_indices(), fused, chunk.inputs, chunk.record)
        r_written = self._write_state(h_end, r_read, layout.real)
        if torch.is_grad_enabled():
            h_end, r_written = FixedPointBackward.apply(h_end, r_written, r_given, depth)
        return h_end, gather_states(r_written, r_in, latest_real)

    def _check_replay_checkpointing(self) -> None:
        """The replay's backward (`FixedPointBackward`) calls torch.autograd.grad, which reentrant activation
        checkpointing refuses mid-backward; refused here, before the forward, with the fix."""
        if any(checkpoints_reentrantly(self.layers[i]) for i in self.middle_layer_indices()):
            raise ValueError(
                "gradient checkpointing with use_reentrant=True cannot run the replayed middle block (bptt_window, "
                "or exact_states=True), whose backward calls torch.autograd.grad: enable it with "
                "gradient_checkpointing_kwargs={'use_reentrant': False} (transformers' default)"
            )

    # ----------------------------------------------------------------------------- Jacobi path
    def _jacobi_middle(
        self, h_low: torch.Tensor, r_in: torch.Tensor, chunk: PreparedChunk, path: ForwardPath
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Cache iterates R<1>..R<d_forward>, then the final (cached) pass of the middle block.

        Iterate k comes from the middle block's output H<k-1> (H<0>: the seed pass, no fusion). The first
        d_forward - d_backward iterates are computed in a no-grad loop, which stops early once
        max |R<k> - R<k-1>| <= jacobi_tol (k >= 2); the last d_backward iterates always run, with gradients.
        With `initial_states` (R after every token, given), R<0> is read from them and every iterate,
        the first included, is a fused pass: there is no seed pass.
        """
        middle, no_cache = self.middle_layer_indices(), chunk.inputs.without_cache()
        layout, recurrence_mask, initial_states = chunk.layout, chunk.recurrence_mask, chunk.initial_states
        latest_real = latest_real_index(layout.real)

        def iterate(r_read: torch.Tensor, seed: bool) -> torch.Tensor:
            fused = h_low if seed else self._fuse(h_low, r_read, recurrence_mask)
            h_end = self._run_layers(middle, fused, no_cache)
            r_out = self._write_state(h_end, r_read, layout.real)
            return states_read(r_out, r_in, latest_real, layout.document_start)

        seeded = initial_states is None  # the first iterate is the seed pass (no fusion)
        r_start = torch.zeros_like(h_low) if seeded else initial_states.to(h_low.dtype)
        r_read = states_read(r_start, r_in, latest_real, layout.document_start)
        detached = path.d_forward - path.d_backward
        iterations: int | torch.Tensor = 0
        with torch.no_grad():
            if path.jacobi_tol is not None and detached > 0 and torch.compiler.is_compiling():
                r_read, iterations = _settle_on_device(iterate, r_read, detached, path.jacobi_tol, seeded)
            else:
                for _ in range(detached):
                    r_next = iterate(r_read, seed=seeded and iterations == 0)
                    moved = None if path.jacobi_tol is None else float((r_next - r_read).abs().max())
                    r_read, iterations = r_next, iterations + 1
                    if moved is not None and iterations >= 2 and moved <= path.jacobi_tol:
                        break  # converged: go on to the iterations that carry gradients
        for step in range(path.d_backward):  # the seed is here only when no detached iterate ran
            r_read = iterate(r_read, seed=seeded and detached == 0 and step == 0)
        iterations = iterations + path.d_backward
        h_end = self._run_layers(middle, self._fuse(h_low, r_read, recurrence_mask), chunk.inputs, chunk.record)
        r_out = gather_states(self._write_state(h_end, r_read, layout.real), r_in, latest_real)
        return h_end, r_out, iterations


class T2MLRForCausalLM(LMHeadOverBackbone, T2MLRPreTrainedModel, T2MLRGenerationMixin):
    """T²MLR causal LM: the backbone `T2MLRModel` (`self.model`) and the base decoder's LM head (`self.lm_head`)."""

    def __init__(self, config: T2MLRConfig, base_model: PreTrainedModel | None = None) -> None:
        """`base_model`: a base `*ForCausalLM` whose parts this model adopts (no copy); None builds a fresh one."""
        config.validate_recurrence()  # first: PreTrainedModel.__init__ reads the base config it needs
        super().__init__(config)
        decoder = base_decoder(config.base_config, config._attn_implementation, base_model, "T²MLR")
        self.model = T2MLRModel(config, decoder=decoder.model)
        self.lm_head = decoder.lm_head
        self.post_init()

    @classmethod
    def from_base(
        cls,
        base: PreTrainedModel | str,
        l_start: int,
        l_end: int,
        load_kwargs: dict[str, Any] | None = None,
        gguf_file: str | None = None,
        **config_kwargs: Any,
    ) -> "T2MLRForCausalLM":
        """Retrofit a pretrained decoder into T²MLR: a model object, or a source `t2mlr.model.pretrained`
        resolves (hub id, local directory, GGUF file or a directory holding one, the shortcut
        `smollm2-135m-instruct`); `gguf_file` names the GGUF file in a directory.

        The fusion starts closed (γ = 0), so the new model's logits equal the base model's until
        training opens the gates. A model object is adopted, not copied: its modules become this
        model's (no second copy of the weights), so training the retrofit changes them; pass
        `copy.deepcopy(base)` to keep the original. `config_kwargs` are recurrence fields only. The
        result is in the base model's train/eval mode.
        """
        check_known_names(config_kwargs, T2MLRConfig.recurrence_fields(), "T2MLRConfig field")
        if isinstance(base, str):
            base, _ = load_pretrained_base(base, gguf_file=gguf_file, with_tokenizer=False, **(load_kwargs or {}))
        elif load_kwargs or gguf_file:
            raise ValueError("load_kwargs and gguf_file apply only when `base` is a hub id or path")
        config = T2MLRConfig.from_base(base.config, l_start=l_start, l_end=l_end, **config_kwargs)
        check_retrofit_fusion(config.fusion, config.fusion_weight)
        return cls(config, base_model=base).train(base.training)

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, plus the modules that let the directory load without
        `import t2mlr` (`trust_remote_code=True`; see `t2mlr.model.remote_code`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code_modules(save_directory)

    @property
    def fusion(self) -> Fusion:
        """The fusion Φ (the paper's: gates `fusion.gamma_cur`, `fusion.gamma_rec`), which lives in the backbone."""
        return self.model.fusion

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: T2MLRCache | T2MLRStaticCache | None = None,
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
        initial_states: torch.Tensor | None = None,
        exact_states: bool = False,
        bptt_window: int | None = None,
        exact_solver: str | None = None,
        fixed_point_tol: float | None = None,
        fixed_point_chunk: int | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **loss_kwargs: Any,
    ) -> T2MLRCausalLMOutput:
        """Causal-LM forward: the backbone (`T2MLRModel.forward`, where every recurrence argument is
        described), then the LM head at the kept positions. Labels are standard causal-LM labels (shifted
        inside, -100 ignored); `loss_kwargs` (e.g. the Trainer's `num_items_in_batch`) go to the loss.
        `return_dict=False` (or the config's `return_dict`) returns the output's fields as a tuple, as every
        transformers model does."""
        checks.checked_labels(labels, input_ids, inputs_embeds, self.config.vocab_size)
        checks.check_no_misspelt_arguments(loss_kwargs, FORWARD_ARGUMENTS)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            recurrence=recurrence,
            d_forward=d_forward,
            d_backward=d_backward,
            jacobi_tol=jacobi_tol,
            recurrence_mask=recurrence_mask,
            document_ids=document_ids,
            initial_states=initial_states,
            exact_states=exact_states,
            bptt_window=bptt_window,
            exact_solver=exact_solver,
            fixed_point_tol=fixed_point_tol,
            fixed_point_chunk=fixed_point_chunk,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        logits, loss = self.logits_and_loss(out.last_hidden_state, labels, logits_to_keep, **loss_kwargs)
        return T2MLRCausalLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            recurrent_state=out.recurrent_state,
            jacobi_iterations=out.jacobi_iterations,
            exact_solve=out.exact_solve,
        )


# The arguments of `T2MLRForCausalLM.forward`; an unknown keyword spelt like one of them is refused.
FORWARD_ARGUMENTS = tuple(
    name for name in inspect.signature(T2MLRForCausalLM.forward).parameters if name not in ("self", "loss_kwargs")
)


def _settle_on_device(
    iterate: Callable[[torch.Tensor, bool], torch.Tensor], r_read: torch.Tensor, detached: int, tol: float,
    seeded: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The detached Jacobi loop with its early stop, for torch.compile: the same iterates as the eager
    loop (seed, then refinements until `detached` ran or, from the second on, none moved by more than
    `tol`), but the stop test stays on the device inside one `torch.while_loop`, because a graph cannot
    branch in Python on a value it computes. Returns the last iterate and how many ran (a 0-d tensor).
    `seeded`: the first iterate is the seed pass (False when the iteration starts from given states)."""
    r_next = iterate(r_read, seeded)
    count = torch.ones((), dtype=torch.long, device=r_read.device)

    def keep_going(count: torch.Tensor, r: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
        return (count < detached) & ((count < 2) | (moved > tol))

    def refine(count: torch.Tensor, r: torch.Tensor, moved: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r_next = iterate(r, False)
        return count + 1, r_next, _largest_move(r_next, r)

    count, r_read, _ = torch.while_loop(keep_going, refine, (count, r_next, _largest_move(r_next, r_read)))
    return r_read, count


def _warn_fallback(report: ExactSolveReport, path: ForwardPath) -> None:
    """Say once per forward that the fixed-point passes hit their cap (the values stay exact)."""
    then = ("the rest of the forward ran sequentially (exact_solver='auto')" if path.exact_solver == "auto"
            else "the sequential step finished their unsettled tokens")
    warnings.warn(
        f"exact_solver: {report.fallbacks()} of {len(report.starts)} chunks had not settled to fixed_point_tol="
        f"{path.fixed_point_tol} after fixed_point_cap={path.fixed_point_cap} passes; {then}. The result is exact; "
        "the output's exact_solve counts the passes (a model whose R settles slowly gains nothing from fixed_point)",
        stacklevel=caller_stacklevel(),
    )


def _largest_move(r_next: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """max |r_next - r| in float64, as the eager loop compares it with the tolerance (a Python float)."""
    return (r_next - r).abs().max().to(torch.float64)


def default_use_cache(config: T2MLRConfig) -> bool:
    """The config's `use_cache` (the base config's when the T²MLR config does not set one; True if neither does)."""
    value = getattr(config, "use_cache", None)
    if value is None:
        value = getattr(config.base_config, "use_cache", None)
    return True if value is None else bool(value)


def _last_state(r_out: torch.Tensor) -> torch.Tensor:
    """R after the chunk's last token; a copy when it carries gradients, since FSDP2 hooks a module's
    outputs and warns that in-place changes to a view would bypass them."""
    last = r_out[:, -1]
    return last.clone() if last.requires_grad else last


def register_auto_classes() -> None:
    """The `t2mlr` model type in transformers' Auto classes (run once, when this module is imported)."""
    AutoConfig.register(T2MLRConfig.model_type, T2MLRConfig, exist_ok=True)
    AutoModel.register(T2MLRConfig, T2MLRModel, exist_ok=True)
    AutoModelForCausalLM.register(T2MLRConfig, T2MLRForCausalLM, exist_ok=True)


register_auto_classes()
