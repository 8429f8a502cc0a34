"""What every analysis shares: loading a model directory the trainer wrote, reading evaluation data
through the trainer's own data code, and the validation loss on a chosen forward path (results are written
by `t2mlr.analysis.report`).

A model directory is anything `save_pretrained` or the trainer wrote: a run's `final/`, one of its
`checkpoints/step_N`, a retrofitted pretrained model, or a saved baseline. Data files are read by
`t2mlr.training.data.build_dataset` from a `DataConfig`, so the analyses see exactly the rows training
saw: a jsonl of text (tokenized with the model directory's tokenizer) or of token ids, a shards
directory written by `t2mlr data tokenize`, or `train` (`TRAINING_DATA`): the data section of the
trainer config saved in the model directory, i.e. the model's own training stream (a factory dataset
such as S5-Retrieval's, with its label alignment).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

import t2mlr.baselines  # noqa: F401  (registers the baseline model types, so saved baselines load too)
from t2mlr.generation.loading import load_model
from t2mlr.model import is_t2mlr
from t2mlr.training.config import DataConfig, config_from_tree
from t2mlr.training.data import Collator, count_targets, labels_aligned
from t2mlr.training.distributed import DistEnv, shard_and_gather
from t2mlr.training.model_factory import PLAIN_FORWARD, RECURRENCE_ONLY_INPUTS
from t2mlr.utils import IGNORE_INDEX, TOKENIZER_FILES

__all__ = [
    "TRAINING_DATA",
    "ModelInfo",
    "causal_lm_loss",
    "collate_for",
    "data_config_for",
    "describe_model",
    "draw_rows",
    "fixed_depth",
    "load_analysis_model",
    "load_t2mlr_model",
    "model_batches",
    "model_inputs",
    "saved_seq_len",
    "validation_loss",
]

TRAINER_CONFIG = "config.yaml"  # the trainer writes its config into every checkpoint and final/
TRAINING_DATA = "train"  # --data train: the data the model directory's saved trainer config trained on


# ---------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelInfo:
    """What a table says about a model: a label, whether it recurs, its depth and its placement."""

    label: str
    recurrent: bool
    num_layers: int
    parameters: int
    placement: tuple[int, int] | None


def load_analysis_model(model_dir: str | Path, device: str = "auto", dtype: str = "float32") -> nn.Module:
    """A saved model (T²MLR or a plain causal LM) in eval mode, in `dtype` (float32 by default, so that
    a model saved in bfloat16 is analysed at full precision; "float64" for exactness checks)."""
    if dtype not in ("float32", "float64", "bfloat16", "auto"):
        raise ValueError(f"dtype must be one of float32, float64, bfloat16, auto; got {dtype!r}")
    model = load_model(model_dir, device=device, dtype="float32" if dtype == "float64" else dtype)
    if dtype == "float64":
        model = model.to(torch.float64)
    return model.eval()


def describe_model(model: nn.Module) -> ModelInfo:
    """Label and shape of a loaded model."""
    parameters = sum(p.numel() for p in model.parameters())
    if is_t2mlr(model):
        cfg = model.config
        return ModelInfo(f"T²MLR({cfg.l_start},{cfg.l_end})", True, cfg.num_layers, parameters, (cfg.l_start, cfg.l_end))
    layers = int(model.config.get_text_config().num_hidden_layers)
    return ModelInfo("Transformer", False, layers, parameters, None)


def load_t2mlr_model(model_dir: Path, device: str, dtype: str, purpose: str) -> tuple[nn.Module, ModelInfo]:
    """`load_analysis_model` and `describe_model` for analyses of the recurrence: a model without one is
    refused, with `purpose` saying why it is needed."""
    model = load_analysis_model(model_dir, device, dtype)
    info = describe_model(model)
    if not is_t2mlr(model):
        raise ValueError(f"{model_dir} holds a {info.label} without recurrence: {purpose}")
    return model, info


@contextlib.contextmanager
def fixed_depth(model: nn.Module) -> Iterator[None]:
    """Switch the Jacobi early stop off for the duration: a saved `jacobi_tol` would otherwise cut the
    iterations short, and these analyses compare fixed depths. (A forward argument cannot do it: an
    argument of None means "the config's value".)"""
    if not is_t2mlr(model):
        yield
        return
    saved = model.config.jacobi_tol
    model.config.jacobi_tol = None
    try:
        yield
    finally:
        model.config.jacobi_tol = saved


# ---------------------------------------------------------------------------------------------- data


def _saved_trainer_tree(model_dir: str | Path) -> dict[str, Any] | None:
    """The trainer config saved in a model directory, as a plain tree; None when it holds none."""
    path = Path(model_dir) / TRAINER_CONFIG
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def saved_seq_len(model_dir: str | Path) -> int | None:
    """The training row length recorded in a trainer-written model directory (its config.yaml), if any."""
    value = ((_saved_trainer_tree(model_dir) or {}).get("data") or {}).get("seq_len")
    return int(value) if value is not None else None


def data_config_for(data: str | Path, model_dir: str | Path, seq_len: int | None = None,
                    tokenizer: str | None = None, eos_token_id: int | None = None) -> DataConfig:
    """A `DataConfig` for a data path: a shards directory (it holds manifest.json) or a jsonl file (text lines use `tokenizer`, by default the model
    directory's own when it has one), or `TRAINING_DATA` (the model's own training data, from its saved config).
    `seq_len` defaults to the length the model was trained with."""
    if str(data) == TRAINING_DATA:
        if tokenizer is not None or eos_token_id is not None:
            raise ValueError(f"--data {TRAINING_DATA} reads the training data as the model was trained on them; "
                             "--tokenizer and --eos-token-id do not apply")
        tree = _saved_trainer_tree(model_dir)
        if tree is None:
            raise ValueError(f"--data {TRAINING_DATA}: {model_dir} holds no {TRAINER_CONFIG} (not written by the "
                             "trainer), so its training data are unknown; pass a data file")
        cfg = config_from_tree(tree).data  # the data section of its saved trainer config: what it trained on
        if seq_len is not None:
            cfg.seq_len = seq_len
        return cfg
    path = Path(data)
    if seq_len is None:
        seq_len = saved_seq_len(model_dir)
        if seq_len is None:
            raise ValueError(f"{model_dir} records no training seq_len (no {TRAINER_CONFIG}); pass --seq-len")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if path.is_dir():
        if not (path / "manifest.json").is_file():
            raise ValueError(f"{path} is a directory without manifest.json: not a shards directory "
                             "(write one with `t2mlr corpus tokenize`)")
        return DataConfig(source="shards", path=str(path), seq_len=seq_len)
    if path.suffix in (".jsonl", ".json"):
        if tokenizer is None and any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
            tokenizer = str(model_dir)  # text lines need one; lines of input_ids do not
        return DataConfig(source="jsonl", path=str(path), seq_len=seq_len, tokenizer=tokenizer,
                          eos_token_id=eos_token_id)
    raise ValueError(f"data {str(path)!r}: expected a jsonl file or a shards directory (`t2mlr data tokenize`)")


def draw_rows(available: int, count: int, seed: int, option: str, data: str | Path) -> list[int]:
    """`count` distinct row indices drawn at random (by `seed`) from the `available` rows of `data`, in
    increasing order; `option` names the command-line option that set `count`."""
    if not 1 <= count <= available:
        raise ValueError(f"{option} must lie in [1, {available}] (rows in {data}), got {count}")
    return sorted(int(i) for i in np.random.default_rng(seed).choice(available, size=count, replace=False))


def collate_for(dataset: Any, cfg: DataConfig | None, indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """One batch of the given rows, stacked by the trainer's collator; with the data config, with its padding
    id and label alignment (aligned labels shifted as in training), else padded with 0 and not aligned."""
    pad, aligned = (0, False) if cfg is None else (cfg.pad_token_id, labels_aligned(dataset, cfg))
    return Collator(pad, aligned)([dataset[int(i)] for i in indices])


def model_batches(dataset: Any, indices: Sequence[int], batch_size: int,
                  cfg: DataConfig | None = None) -> list[dict[str, torch.Tensor]]:
    """The given rows in batches of `batch_size` (the last one may be smaller); with the data config, padded
    and aligned as the trainer's batches are."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    indices = list(indices)
    return [collate_for(dataset, cfg, indices[i : i + batch_size]) for i in range(0, len(indices), batch_size)]


def model_inputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Batch tensors on the model's device; plain models do not get the recurrence-only keys and run without a
    cache (`PLAIN_FORWARD`), as in training."""
    device = next(model.parameters()).device
    if is_t2mlr(model):
        return {k: v.to(device) for k, v in batch.items()}
    keep = {k: v.to(device) for k, v in batch.items() if k not in RECURRENCE_ONLY_INPUTS}
    return {**keep, **PLAIN_FORWARD}


# ---------------------------------------------------------------------------------------------- losses


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in the logits' own dtype (transformers' loss upcasts only to
    float32, which would hide float64 agreement), -100 labels skipped."""
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX
    )


@torch.no_grad()
def validation_loss(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]], env: DistEnv | None = None,
                    **path: Any) -> dict[str, float]:
    """Mean token loss (nats) and perplexity over `batches`, every token weighted equally; `path` are the
    forward-path arguments (recurrence, d_forward, ...), for T²MLR models only. Under torchrun (`env`) the
    batches are shared out over the ranks; the sum runs in the batches' order, so the result is one process's."""
    if path and not is_t2mlr(model):
        raise ValueError(f"forward-path arguments {sorted(path)} apply to T²MLR models only")
    started = time.perf_counter()

    def batch_loss(batch: dict[str, torch.Tensor]) -> tuple[float, int]:
        inputs = model_inputs(model, batch)
        labels = inputs.pop("labels")
        logits = model(**inputs, **path).logits
        n = count_targets({"labels": labels})
        return float(causal_lm_loss(logits.float(), labels)) * n, n

    with fixed_depth(model):
        losses = shard_and_gather(batches, batch_loss, env)
    targets = sum(n for _, n in losses)
    if targets == 0:
        raise ValueError("the evaluation batches hold no scored token")
    loss = sum(loss_sum for loss_sum, _ in losses) / targets
    return {"loss": loss, "ppl": math.exp(loss) if loss < 50 else float("inf"), "tokens": targets,
            "seconds": time.perf_counter() - started}
