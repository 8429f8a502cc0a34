"""Teacher-forced evaluation of S5-Retrieval for any of the compared models, per number of actions N.

Each model reads the whole input once; its prediction at position t is argmax(logits[t]) and is
compared with target[t] (the transduction alignment of `t2mlr.experiments.s5_data`). Only positions
after the delimiter are scored, with `t2mlr.tasks.scoring`: sequence exact match (every scored token
right) and per-token accuracy. Rows of one N have one length, so batches need no padding.

T²MLR is evaluated on its exact path: the caller passes `recurrence="exact"` explicitly (see
`forward_kwargs`), never relying on the config's default (docs/semantics.md §9). `path` names another
path for the Jacobi-vs-exact analysis (e.g. `{"recurrence": "jacobi", "d_forward": 8}`, early stop off).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from t2mlr.analysis.common import fixed_depth
from t2mlr.model import is_t2mlr
from t2mlr.tasks.scoring import aggregate_s5_by_n, score_s5_prediction

__all__ = ["NMetrics", "evaluate_by_n", "forward_kwargs", "group_by_n", "summarize"]


@dataclass(frozen=True)
class NMetrics:
    """Scores of one N: exact-match rate, per-token accuracy, number of sequences."""

    exact_match: float
    token_accuracy: float
    count: int


def forward_kwargs(model: nn.Module, path: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The evaluation path, explicit: T²MLR's exact recurrence, or `path` when given; nothing for the
    baselines (a path for a model without recurrence is an error)."""
    if not is_t2mlr(model):
        if path:
            raise ValueError(f"the evaluation path {dict(path)} applies to T²MLR models only")
        return {}
    return dict(path) if path else {"recurrence": "exact"}


def group_by_n(samples: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for sample in samples:
        groups.setdefault(int(sample["n"]), []).append(sample)
    return dict(sorted(groups.items()))


def _ids(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[int]:
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError("an S5 sample has symbols missing from the tokenizer; regenerate data and tokenizer together")
    return ids


@torch.no_grad()
def _predict(model: nn.Module, input_ids: torch.Tensor, kwargs: Mapping[str, Any]) -> torch.Tensor:
    """argmax token at every position: the model's guess for the aligned target there."""
    return model(input_ids=input_ids, **kwargs).logits.argmax(dim=-1).cpu()


def evaluate_by_n(
    model: nn.Module,
    samples: Sequence[Mapping[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    device: torch.device | str = "cpu",
    desc: str = "eval",
    path: Mapping[str, Any] | None = None,
) -> dict[int, NMetrics]:
    """Per-N metrics of `model` on `samples` (teacher-forced; T²MLR on the exact path, or on `path`)."""
    kwargs = forward_kwargs(model, path)
    was_training = model.training
    model.eval()
    records = []
    groups = group_by_n(samples)
    try:
        with fixed_depth(model), tqdm(total=len(samples), desc=desc, unit="seq", dynamic_ncols=True) as bar:
            for n, group in groups.items():
                for start in range(0, len(group), batch_size):
                    chunk = group[start : start + batch_size]
                    inputs = torch.tensor([_ids(tokenizer, s["input_tokens"]) for s in chunk], device=device)
                    predicted = _predict(model, inputs, kwargs)
                    for sample, row in zip(chunk, predicted.tolist()):
                        target = _ids(tokenizer, sample["target_tokens"])
                        records.append((n, score_s5_prediction(row, target, int(sample["score_start"]))))
                    bar.update(len(chunk))
    finally:
        model.train(was_training)
    return {n: NMetrics(em, acc, count) for n, (em, acc, count) in aggregate_s5_by_n(records).items()}


def summarize(metrics: Mapping[int, NMetrics], lo: int, hi: int) -> tuple[float, float] | None:
    """Mean exact match and mean token accuracy over N in [lo, hi] (each N weighted equally)."""
    chosen = [m for n, m in metrics.items() if lo <= n <= hi]
    if not chosen:
        return None
    return (sum(m.exact_match for m in chosen) / len(chosen), sum(m.token_accuracy for m in chosen) / len(chosen))
