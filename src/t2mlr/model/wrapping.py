"""What every model that runs a Hugging Face decoder's parts in an order of its own shares: T²MLR here,
and the looped and pause-token baselines of `t2mlr.baselines`.

Such a model is laid out as every transformers causal LM is: a backbone (`T2MLRModel`, `LoopedModel`,
`PauseModel`) under `model.`, holding the base decoder's embedding, blocks, final norm and rotary
embedding under their usual names (`DecoderBackbone`), and the LM head beside it (`LMHeadOverBackbone`).
The backbone returns the hidden states after the final norm (`last_hidden_state`), so tools that score
tokens through `model.base_model` and `get_output_embeddings()` (TRL's fused heads, PEFT, lm-eval) see
what they see in a `LlamaForCausalLM`, and a Llama-family checkpoint's tensors keep their names.

The parts come from a base `*ForCausalLM` (Llama, Mistral, Qwen2, Qwen3): a pretrained one is adopted,
neither copied nor re-initialised; otherwise a fresh one is built from the base config. The blocks a
model runs several times per step are the ones worth checkpointing. A block call that writes a KV
cache is never checkpointed: its recomputation in backward would write the cache a second time, and
transformers' checkpointing layer avoids that by dropping the cache, which would silently break the
exact path's token loop. All of this is written once, here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .checkpoint_keys import LEGACY_KEY_MAPPING
from .layout import LayerInputs, TokenLayout, layer_inputs

WRAPPABLE_PARTS = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")
DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def check_wrappable(base: nn.Module, model_name: str = "T²MLR") -> None:
    """The parts a wrapper drives exist on `base`; the message names the first missing one."""
    for dotted in WRAPPABLE_PARTS:
        owner = base
        for name in dotted.split("."):
            owner = getattr(owner, name, None)
        if owner is None:
            raise ValueError(
                f"cannot wrap {type(base).__name__}: {model_name} needs a *ForCausalLM with "
                f"{', '.join('.' + part for part in WRAPPABLE_PARTS)} (Llama, Mistral, Qwen2, Qwen3); "
                f"{'.' + dotted} is missing"
            )


def keep_initialised(base_model: PreTrainedModel) -> None:
    """Mark a given base model's weights as initialised, so `post_init` of the wrapper leaves them as
    they are (no re-initialisation, no copy of the state dict to restore them)."""
    for module in base_model.modules():
        module._is_hf_initialized = True


def base_decoder(
    base_config: PretrainedConfig, attn_implementation: str | None, base_model: PreTrainedModel | None, model_name: str
) -> PreTrainedModel:
    """The `*ForCausalLM` whose parts a wrapper adopts: `base_model` as it is (marked initialised, not
    copied), or a fresh one built from `base_config`; checked to expose the parts the wrapper runs."""
    if base_model is None:
        base_model = AutoModelForCausalLM.from_config(base_config, attn_implementation=attn_implementation)
    else:
        keep_initialised(base_model)
    check_wrappable(base_model, model_name)
    return base_model


def follow_placement(reference: torch.Tensor, modules: Iterable[nn.Module | None]) -> None:
    """Move a wrapper's own new modules to the device and dtype of `reference` (the embedding's weight)."""
    for module in modules:
        if module is not None:
            module.to(device=reference.device, dtype=reference.dtype)


def checkpoint_blocks(layers: nn.ModuleList, indices: Iterable[int], enabled: bool) -> None:
    """Activation checkpointing of chosen decoder blocks only (each run of a block recomputes its
    activations in backward). transformers' decoder layers read these two attributes."""
    for i in indices:
        layers[i].gradient_checkpointing = enabled
        layers[i]._gradient_checkpointing_func = lambda fn, *a: checkpoint(fn, *a, use_reentrant=False)


def checkpoints_reentrantly(layer: nn.Module) -> bool:
    """Whether a block runs under reentrant activation checkpointing in this forward: transformers'
    `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})` (torch's default
    when the keyword is left out), in training mode."""
    if not checkpoints_now(layer):
        return False
    function = getattr(layer, "_gradient_checkpointing_func", None)
    keywords = getattr(function, "keywords", None)  # transformers stores a functools.partial of checkpoint
    return keywords is not None and keywords.get("use_reentrant") is not False


def call_block(layer: nn.Module, hidden: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """One decoder-layer call; checkpointed (when enabled and training) only if it writes no KV cache and
    keeps a graph (the Jacobi path's detached iterations have nothing to recompute).

    transformers' checkpointing wrapper drops a cache it is given (up to 5.19 it wraps the layer's
    `__call__`, from 5.23 its `forward`), so a call that writes one runs with the layer's checkpointing
    paused: on every version the wrapper then passes the call through, hooks included."""
    writes_cache = kwargs.get("past_key_values") is not None
    if checkpoints_now(layer) and (writes_cache or not torch.is_grad_enabled()):
        with checkpointing_paused(layer):
            return layer(hidden, **kwargs)
    return layer(hidden, **kwargs)


def checkpoints_now(layer: nn.Module) -> bool:
    """Whether transformers' checkpointing wrapper of this block is active: enabled, and in training mode."""
    return bool(getattr(layer, "gradient_checkpointing", False)) and layer.training


@contextmanager
def checkpointing_paused(layer: nn.Module) -> Iterator[None]:
    """The block's activation checkpointing switched off for one call (restored afterwards)."""
    layer.gradient_checkpointing = False
    try:
        yield
    finally:
        layer.gradient_checkpointing = True


class AttentionRecorder:
    """The attention weights of every block during one forward, as `output_attentions=True` returns them.

    transformers' eager attention returns its weights as the second output of each block's `self_attn`; a
    forward hook keeps them for every call. A block that ran once over the chunk (or several times, the last
    over the chunk: the Jacobi path's final pass) gives that call's (batch, heads, chunk, keys); a block that
    ran token by token (the exact path) gives one row per token over the keys cached at its step, placed at
    their positions in a (batch, heads, chunk, past + chunk) matrix (zeros where a token does not attend).
    Use as a context manager: the hooks go when it closes."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.calls: list[list[torch.Tensor]] = [[] for _ in layers]
        self._hooks = [layer.self_attn.register_forward_hook(self._keeper(i)) for i, layer in enumerate(layers)]

    def _keeper(self, index: int) -> Any:
        def keep(module: nn.Module, args: Any, output: Any) -> None:
            self.calls[index].append(output[1])

        return keep

    def __enter__(self) -> "AttentionRecorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        for hook in self._hooks:
            hook.remove()

    def weights(self, chunk: int, past: int | torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One attention matrix per block for a chunk of `chunk` tokens after `past` cached ones."""
        return tuple(_attention_matrix(calls, chunk, int(past)) for calls in self.calls)


def _attention_matrix(calls: list[torch.Tensor], chunk: int, past: int) -> torch.Tensor:
    """A block's weights over the chunk: its last call's if that covered the chunk, else its last `chunk`
    one-query calls as rows. A row's keys end at its own token (a sliding window keeps only the latest),
    except in a static cache, whose rows span every slot from the first."""
    last = calls[-1]
    if last.shape[2] == chunk:
        return last
    rows = calls[-chunk:]
    width = max(past + chunk, max(row.shape[-1] for row in rows))
    matrix = last.new_zeros(*last.shape[:2], chunk, width)
    for t, row in enumerate(rows):
        keys = row.shape[-1]
        end = past + t + 1 if keys <= past + t + 1 else keys
        matrix[:, :, t, end - keys : end] = row[:, :, 0]
    return matrix


def logits_positions(logits_to_keep: int | torch.Tensor) -> slice | torch.Tensor:
    """Which positions get logits: the last `n` (0 = all) or explicit indices, as in transformers."""
    return slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep


class RunsBaseDecoder:
    """What transformers asks of a model about its blocks: the attention backends and device-map splits of
    the base decoders it runs, gradient checkpointing (of the blocks, see `call_block`), and the switch of
    the attention implementation, which must reach the base decoder's config that the blocks read."""

    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"]  # noqa: RUF012
    _skip_keys_device_placement = ["past_key_values"]  # noqa: RUF012  (as the base decoders: accelerate leaves caches be)

    def set_attn_implementation(self, attn_implementation: str | dict, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.set_attn_implementation`, carried to the base decoder's config: the blocks'
        attention modules and the mask builders read that one, not the wrapper's (a dict may name it
        "base_config"; other keys are transformers')."""
        super().set_attn_implementation(attn_implementation, *args, **kwargs)
        chosen = self.config._attn_implementation
        if isinstance(attn_implementation, dict):
            chosen = attn_implementation.get("base_config", chosen)
        for config in decoder_configs(self):
            if config._attn_implementation != chosen:
                config._attn_implementation = chosen


def decoder_configs(model: nn.Module) -> list[PretrainedConfig]:
    """The base decoder's config objects a wrapper's modules read (`config.base_config`, and whatever the
    blocks' own modules hold: one object when the parts were built or adopted with it)."""
    own = type(model.config)
    found = {id(model.config.base_config): model.config.base_config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig) and not isinstance(config, own):
            found.setdefault(id(config), config)
    return list(found.values())


class DecoderBackbone(RunsBaseDecoder):
    """Mixin of a backbone `PreTrainedModel` (list it before PreTrainedModel) that holds a base decoder's
    parts as its own `embed_tokens`, `layers`, `norm` and `rotary_emb`.

    `adopt_decoder_parts` takes them from a base decoder's inner model; `run_block` calls one block
    with a chunk's shared inputs; `chunk_inputs` builds those inputs (masks, rotary embeddings).
    """

    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    norm: nn.Module
    rotary_emb: nn.Module

    def adopt_decoder_parts(self, decoder: nn.Module | None) -> None:
        """Make the inner model's (e.g. a `LlamaModel`'s) embedding, blocks, norm and rotary embedding ours;
        None builds a fresh one from the config's base config."""
        if decoder is None:
            decoder = AutoModel.from_config(self.config.base_config, attn_implementation=self.config._attn_implementation)
        for name in DECODER_PARTS:
            setattr(self, name, getattr(decoder, name))

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def chunk_inputs(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, layout: TokenLayout, cache: Any,
        full_masks: bool = False,
    ) -> LayerInputs:
        """Masks and rotary embeddings of a chunk, shared by every block call (`layout.layer_inputs`)."""
        return layer_inputs(self.config.base_config, self.rotary_emb, hidden, attention_mask, layout, cache, full_masks)

    def run_block(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: Any = None) -> torch.Tensor:
        """Decoder block `index` (0-based) on the chunk; `cache` defaults to the chunk's own (None: none)."""
        cache = inputs.cache if cache is None else cache
        return call_block(
            self.layers[index],
            hidden,
            attention_mask=inputs.masks[index],
            position_ids=inputs.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=inputs.position_embeddings,
        )


class BackboneAndHead:
    """Mixin of a causal LM (list it before PreTrainedModel) that is a backbone under `model`, whose token
    embedding is `model.embed_tokens`, plus `lm_head`: the accessors transformers and PEFT use."""

    model: nn.Module
    lm_head: nn.Module

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def get_decoder(self) -> nn.Module:
        return self.model


class LMHeadOverBackbone(BackboneAndHead, RunsBaseDecoder):
    """Mixin of a causal LM over a base decoder's parts (list it before PreTrainedModel).

    Tying, the loss and the base decoder as a standalone model are written here once; `from_pretrained`
    also reads checkpoints written before the backbone layout (0.1).
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # noqa: RUF012  (transformers' API)

    def logits_and_loss(
        self, hidden: torch.Tensor, labels: torch.Tensor | None, logits_to_keep: int | torch.Tensor, **loss_kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The LM head at the kept positions of the backbone's (normed) output, and the causal-LM loss
        (labels shifted inside, -100 ignored) when labels are given."""
        logits = self.lm_head(hidden[:, logits_positions(logits_to_keep)])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **loss_kwargs)
        return logits, loss

    def base_decoder(self) -> PreTrainedModel:
        """The base decoder as a standalone `*ForCausalLM` (e.g. a `LlamaForCausalLM`) sharing this model's
        embedding, blocks, norm and head (no copy): what this model computes without its own additions."""
        with torch.device("meta"):
            decoder = AutoModelForCausalLM.from_config(
                self.config.base_config, attn_implementation=self.config._attn_implementation
            )
        for name in DECODER_PARTS:
            setattr(decoder.model, name, getattr(self.model, name))
        decoder.lm_head = self.lm_head
        return decoder.train(self.training)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """`PreTrainedModel.from_pretrained`, also for checkpoints in the 0.1 layout (`checkpoint_keys`):
        their tensor names are mapped on load, and the model saves in today's layout."""
        kwargs["key_mapping"] = {**LEGACY_KEY_MAPPING, **(kwargs.get("key_mapping") or {})}
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        model._weight_conversions = None  # transformers would save with the legacy names otherwise
        return loaded
