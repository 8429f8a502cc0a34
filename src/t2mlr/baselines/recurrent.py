"""The recurrent language-model baselines: LSTM (the S5-Retrieval experiment's, paper §5: 4 layers), GRU and
vanilla RNN (tanh), as in the authors' release.

Embedding → a stacked `nn.LSTM` / `nn.GRU` / `nn.RNN` (`num_layers`, all of one width) → Linear head, as a
`PreTrainedModel` so each trains, saves and loads exactly like T²MLR and the matched Transformer
(`save_pretrained`, `AutoModelForCausalLM`; model types `t2mlr_lstm`, `t2mlr_gru`, `t2mlr_rnn`). Their hidden
size is searched so their parameter count matches T²MLR's (`t2mlr.baselines.matching`). The three differ only
in the cell: one torch module per layer with 4 (LSTM), 3 (GRU) or 1 (RNN) gate blocks of
`2·hidden² + 2·hidden` parameters each (input and recurrent weights and biases).

Interface shared with the other models: `forward(input_ids, attention_mask=None, labels=None)` returns
`.logits` and, with labels, `.loss` (standard causal-LM labels: logits[t] is scored against
labels[t+1], -100 ignored).

* Padding (left or right) never reaches the recurrence: the real tokens of each row are run as one
  packed sequence, and pad positions get the logits of a zero hidden state. So a row's logits do not
  depend on its padding, as for T²MLR (docs/semantics.md §4).
* `position_ids` is only checked: a recurrent network has no positions, but a row that packs several
  documents (positions restarting at 0 mid-row) would carry state across them, so it is refused.
* Every other keyword (T²MLR's `recurrence`, `d_forward`, `d_backward`, `jacobi_tol`, `use_cache`, …)
  is accepted and ignored, so one call site drives every model of a comparison; these models have a
  single forward path.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from t2mlr.model.layout import starts_a_later_document
from t2mlr.model.wrapping import BackboneAndHead
from t2mlr.utils import IGNORE_INDEX

__all__ = [
    "RECURRENT_CELLS",
    "RecurrentBackbone",
    "RecurrentLMConfig",
    "RecurrentLMForCausalLM",
    "T2MLRGRUConfig",
    "T2MLRGRUForCausalLM",
    "T2MLRLSTMConfig",
    "T2MLRLSTMForCausalLM",
    "T2MLRRNNConfig",
    "T2MLRRNNForCausalLM",
    "recurrent_config_class",
]

# cell name: (torch module, gate blocks per layer, label in tables and messages)
CELLS: dict[str, tuple[type[nn.RNNBase], int, str]] = {
    "lstm": (nn.LSTM, 4, "LSTM"),
    "gru": (nn.GRU, 3, "GRU"),
    "rnn": (nn.RNN, 1, "RNN"),
}
RECURRENT_CELLS = tuple(CELLS)


class RecurrentLMConfig(PretrainedConfig):
    """Vocabulary, width and depth of a recurrent baseline; the embedding width equals `hidden_size`. Each
    subclass names its `cell` (a key of `CELLS`) and its own `model_type`."""

    cell: ClassVar[str]

    def __init__(
        self,
        vocab_size: int = 188,
        hidden_size: int = 256,
        num_layers: int = 4,
        initializer_range: float = 0.02,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if tie_word_embeddings:
            raise ValueError(f"the {self.cell_label} baseline keeps its embedding and head separate: "
                             "tie_word_embeddings must be False")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.initializer_range = initializer_range
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=False, **kwargs)

    @property
    def cell_label(self) -> str:
        return CELLS[self.cell][2]

    @property
    def cell_gates(self) -> int:
        """Gate blocks per layer: each is an input and a recurrent hidden × hidden matrix with their biases."""
        return CELLS[self.cell][1]


# KEEP_INIT: transformers makes every config subclass a dataclass, whose generated `__init__` would replace the
# inherited one (and its checks) unless the subclass defines its own.
class T2MLRLSTMConfig(RecurrentLMConfig):
    model_type = "t2mlr_lstm"
    cell = "lstm"
    __init__ = RecurrentLMConfig.__init__  # see KEEP_INIT


class T2MLRGRUConfig(RecurrentLMConfig):
    model_type = "t2mlr_gru"
    cell = "gru"
    __init__ = RecurrentLMConfig.__init__  # see KEEP_INIT


class T2MLRRNNConfig(RecurrentLMConfig):
    model_type = "t2mlr_rnn"
    cell = "rnn"
    __init__ = RecurrentLMConfig.__init__  # see KEEP_INIT


def recurrent_config_class(cell: str) -> type[RecurrentLMConfig]:
    """The config class of a cell name ("lstm", "gru", "rnn")."""
    classes = {cls.cell: cls for cls in (T2MLRLSTMConfig, T2MLRGRUConfig, T2MLRRNNConfig)}
    if cell not in classes:
        raise ValueError(f"unknown recurrent cell {cell!r}; cells are {', '.join(RECURRENT_CELLS)}")
    return classes[cell]


class RecurrentBackbone(nn.Module):
    """Token embedding and the stacked cell (no dropout: the baselines train without regularisers). The
    cell is stored under its own name (`lstm`, `gru`, `rnn`), which is what its checkpoints' keys say."""

    def __init__(self, config: RecurrentLMConfig) -> None:
        super().__init__()
        self.cell_name = config.cell
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        module = CELLS[config.cell][0]
        self.add_module(config.cell, module(config.hidden_size, config.hidden_size, num_layers=config.num_layers,
                                            batch_first=True))

    @property
    def recurrent(self) -> nn.RNNBase:
        return getattr(self, self.cell_name)

    @property
    def layers(self) -> tuple[nn.Module, ...]:
        """The trainer's per-layer units (FSDP wrapping): the stacked cell is a single unit."""
        return (self.recurrent,)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Hidden states (batch, seq, hidden); zero at padding positions."""
        embeds = self.embed_tokens(input_ids)
        if attention_mask is None or bool(attention_mask.all()):
            return self.recurrent(embeds)[0]
        return self._packed(embeds, attention_mask.bool())

    def _packed(self, embeds: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Run only the real tokens of each row (moved to the front, order kept), then put them back."""
        order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
        lengths = real.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("attention_mask has a row without any real token")
        index = order[..., None].expand(-1, -1, embeds.shape[-1])
        front = embeds.gather(1, index)
        packed = pack_padded_sequence(front, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.recurrent(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=embeds.shape[1])
        return torch.zeros_like(out).scatter(1, index, out)


class RecurrentLMForCausalLM(BackboneAndHead, PreTrainedModel):
    """A recurrent causal LM with the same forward/save/load interface as T²MLR (see the module docstring)."""

    config_class = RecurrentLMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["RecurrentBackbone"]

    def __init__(self, config: RecurrentLMConfig) -> None:
        super().__init__(config)
        self.model = RecurrentBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        **unused: Any,
    ) -> CausalLMOutput:
        """Logits (and the causal-LM loss when `labels` is given); `unused` keywords are ignored (see module)."""
        _check_ids(input_ids, self.config.vocab_size)
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
            )
        _check_single_document(position_ids, attention_mask, self.config.cell_label)
        logits = self.lm_head(self.model(input_ids, attention_mask))
        loss = None if labels is None else causal_lm_loss(logits, labels)
        return CausalLMOutput(loss=loss, logits=logits)


class T2MLRLSTMForCausalLM(RecurrentLMForCausalLM):
    config_class = T2MLRLSTMConfig


class T2MLRGRUForCausalLM(RecurrentLMForCausalLM):
    config_class = T2MLRGRUConfig


class T2MLRRNNForCausalLM(RecurrentLMForCausalLM):
    config_class = T2MLRRNNConfig


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[t] against labels[t+1] over labels that are not -100."""
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
    shifted_logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
    shifted_labels = labels[:, 1:].reshape(-1).to(logits.device)
    return nn.functional.cross_entropy(shifted_logits, shifted_labels, ignore_index=IGNORE_INDEX)


def _check_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (batch, seq) with seq >= 1, got {tuple(input_ids.shape)}")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{low}, {high}]")


def _check_single_document(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, label: str) -> None:
    """Refuse rows whose positions restart at 0 after their first real token (packed documents)."""
    if position_ids is None:
        return
    real = torch.ones_like(position_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if starts_a_later_document((position_ids == 0) & real, real):
        raise ValueError(
            f"the {label} baseline cannot reset its state inside a row: position_ids restart at 0 mid-row "
            "(packed documents); give it one document per row"
        )
