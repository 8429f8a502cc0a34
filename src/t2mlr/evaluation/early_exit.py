"""Early-exit ("skip-layer") evaluation: a model scored with the blocks after a chosen one skipped, the final norm
and the LM head applied to that block's output (the authors' release's skip-layer inference).

`exit_layer` E is 1-based like T²MLR's placements: blocks 1..E run, blocks E+1..L are skipped, so the logits are
head(norm(output of block E)); E = L is the whole model. Defined for

* plain decoders (Llama, Mistral, Qwen2/3 and the matched Transformer): exactly the model truncated to its
  first E blocks;
* T²MLR(l_start, l_end) with E >= l_end: the recurrence runs unchanged on every path (exact, Jacobi, cached
  decoding): R is block l_end's output, which still exists, and only blocks above E are skipped. So the scores
  are those of T²MLR(l_start, l_end) on the base truncated to E blocks.

Refused, with the reason: a T²MLR exit inside or before the recurrent block (E < l_end). Inside it
(l_start <= E < l_end), skipping blocks would change R itself, the output of block l_end, so the model would
run another recurrence; before it (E < l_start), block E's output is not reached by the recurrence at all (Φ
acts on block l_start's input), so that score is the base decoder's early exit: evaluate the base model (or
T²MLR with recurrence off) at E instead. Also refused: the looped and pause-token models, which run blocks
several times or over inserted tokens (an exit "after block E" is not one point of their computation), and
the recurrent (LSTM, GRU, RNN) baselines, which have no blocks.

No model code changes for this: `skipped_blocks(model, E)` puts a `SkippedBlock` (it returns its input) in
place of each block above E in the model's own block list, and puts the blocks back when it exits. A skipped
block writes no keys or values, so cached decoding and `generate()` run as the truncated model's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from t2mlr.baselines import LoopedForCausalLM, PauseForCausalLM, RecurrentLMForCausalLM
from t2mlr.generation.text import underlying
from t2mlr.model import is_t2mlr

__all__ = ["SkippedBlock", "check_exit_layer", "check_saved_exit_layer", "restore_blocks", "skip_blocks_after",
           "skipped_blocks"]


class SkippedBlock(nn.Module):
    """A decoder block that is not run: its output is its input. It keeps the replaced block's `attention_type`,
    which some decoders read to pick the block's attention mask."""

    def __init__(self, replaced: nn.Module) -> None:
        super().__init__()
        attention_type = getattr(replaced, "attention_type", None)
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a plain causal LM or T²MLR (`model.model.layers`); ValueError for a model whose
    early exit is not defined here (see the module docstring)."""
    if isinstance(model, (LoopedForCausalLM, PauseForCausalLM)):
        raise ValueError(f"{type(model).__name__} runs its blocks several times or over pause tokens: an early exit "
                         "after one block is defined for plain decoders and T²MLR only")
    if isinstance(model, RecurrentLMForCausalLM):
        raise ValueError(f"{type(model).__name__} is a recurrent network without decoder blocks: it has no early exit")
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder block list (model.model.layers) to exit from")
    return layers


def check_exit_layer(model: nn.Module, exit_layer: int) -> None:
    """ValueError, naming the valid range, unless `exit_layer` is an early exit this model defines."""
    model = underlying(model)
    count = len(_blocks(model))
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer <= count:
        raise ValueError(f"exit_layer must be a block number in 1..{count} (1-based: blocks 1..E run), got "
                         f"{exit_layer!r}")
    if is_t2mlr(model) and exit_layer < model.config.l_end:
        start, end = model.config.l_start, model.config.l_end
        inside = exit_layer >= start
        why = ("an exit inside it would change R itself" if inside else
               f"block {exit_layer}'s output is not reached by the recurrence: evaluate the base model there")
        raise ValueError(
            f"exit_layer {exit_layer} is {'inside' if inside else 'before'} the recurrent block {start}..{end} of "
            f"T²MLR({start},{end}): choose {end}..{count} (the recurrence runs unchanged, R being block {end}'s "
            f"output); {why}"
        )


def check_saved_exit_layer(model_dir: str, exit_layer: int) -> None:
    """`check_exit_layer` for a saved model, read from its config alone (the model is built on the meta device, no
    weights are loaded), so a bad exit layer is refused before an evaluation loads and scores anything. (Importing
    the baselines registered their model types.)"""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    check_exit_layer(model, exit_layer)


def skip_blocks_after(model: nn.Module, exit_layer: int) -> list[tuple[int, nn.Module]]:
    """Replace the blocks above `exit_layer` by `SkippedBlock`s in place; returns (index, block) of each replaced
    block, which `restore_blocks` puts back (an evaluator that owns the model may keep it this way)."""
    check_exit_layer(model, exit_layer)
    layers = _blocks(underlying(model))
    replaced = [(index, layers[index]) for index in range(exit_layer, len(layers))]
    for index, block in replaced:
        layers[index] = SkippedBlock(block)
    return replaced


def restore_blocks(model: nn.Module, replaced: list[tuple[int, nn.Module]]) -> None:
    layers = _blocks(underlying(model))
    for index, block in replaced:
        layers[index] = block


@contextlib.contextmanager
def skipped_blocks(model: nn.Module, exit_layer: int | None) -> Iterator[nn.Module]:
    """The model with the blocks above `exit_layer` skipped for the duration (None: unchanged)."""
    if exit_layer is None:
        yield model
        return
    replaced = skip_blocks_after(model, exit_layer)
    try:
        yield model
    finally:
        restore_blocks(model, replaced)
