"""Gradient fidelity of the Jacobi path: how close the gradient at (d_forward, d_backward) comes to the
gradient at a deep anchor setting, on one batch (the paper's appendix "On the Validity of Approximation
Depth", figure grad_analysis: anchor (32, 32); drastic differences below d_forward 8 or at
d_backward <= 4).

For every setting the whole gradient of the loss (all trainable parameters, flattened into one vector)
is compared with the anchor's by cosine similarity and by the relative l2 distance
||g - g_anchor|| / ||g_anchor||. The wall-clock time of the forward and backward pass is reported beside
them, so a user can pick the cheapest setting whose cosine clears a threshold.

The model runs in eval mode (no dropout: the settings differ only in their depth) with the Jacobi early
stop switched off. With d_forward = d_backward >= T + 1 (T the row length) the Jacobi gradient is the
exact path's untruncated gradient: the shifted iteration reaches its fixed point in T steps and its
Jacobian is nilpotent, so backpropagating through all iterates gives the exact derivative.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from t2mlr.analysis.benchmarking import timed
from t2mlr.analysis.common import (
    causal_lm_loss,
    collate_for,
    data_config_for,
    draw_rows,
    fixed_depth,
    load_t2mlr_model,
    model_inputs,
)
from t2mlr.analysis.depth_grid import DEFAULT_ANCHOR, DEFAULT_DEPTHS
from t2mlr.analysis.figures import plot_gradient_fidelity
from t2mlr.analysis.report import table, write_result
from t2mlr.model import is_t2mlr
from t2mlr.training.data import build_dataset

__all__ = [
    "DEFAULT_ANCHOR",
    "DEFAULT_DEPTHS",
    "FidelityRow",
    "compare_gradients",
    "gradient_of",
    "parse_depth",
    "parse_depths",
    "run_gradient_fidelity",
]

STEM, FIGURE = "gradient_fidelity", "gradient_fidelity.png"


@dataclass
class FidelityRow:
    """One setting against the anchor."""

    d_forward: int
    d_backward: int
    cosine: float
    relative_l2: float
    loss: float
    seconds: float


def parse_depth(text: str, what: str = "depth") -> tuple[int, int]:
    """"16:4" → (16, 4), checked: 1 <= d_backward <= d_forward."""
    forward, sep, backward = text.strip().partition(":")
    try:
        pair = (int(forward), int(backward))
    except ValueError:
        pair = None
    if not sep or pair is None:
        raise ValueError(f"{what}: expected D_FORWARD:D_BACKWARD such as 16:4, got {text!r}")
    if not 1 <= pair[1] <= pair[0]:
        raise ValueError(f"{what} {text!r}: need 1 <= d_backward <= d_forward")
    return pair


def parse_depths(text: str) -> list[tuple[int, int]]:
    """"2:1,4:4" → [(2, 1), (4, 4)], duplicates dropped, order kept."""
    pairs = [parse_depth(part, "--depths") for part in text.split(",") if part.strip()]
    if not pairs:
        raise ValueError(f"--depths: expected at least one D_FORWARD:D_BACKWARD, got {text!r}")
    return list(dict.fromkeys(pairs))


def gradient_of(model: nn.Module, batch: dict[str, torch.Tensor], **path: Any) -> tuple[list[torch.Tensor], float]:
    """The loss gradient of every trainable parameter (in `named_parameters` order; zeros where a
    parameter gets none) on one batch, and the loss. `path`: the forward-path arguments."""
    params = [p for p in model.parameters() if p.requires_grad]
    inputs = model_inputs(model, batch)
    labels = inputs.pop("labels")
    with torch.enable_grad(), fixed_depth(model):
        loss = causal_lm_loss(model(**inputs, **path).logits, labels)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)], float(loss.detach())


def compare_gradients(grad: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Cosine similarity and relative l2 distance ||g - a|| / ||a|| of two flattened gradients (computed
    tensor by tensor in float64, so no flattened copy is made)."""
    if len(grad) != len(anchor):
        raise ValueError(f"gradients of different models: {len(grad)} vs {len(anchor)} tensors")
    dot = g_sq = a_sq = diff_sq = 0.0
    for g, a in zip(grad, anchor):
        g64, a64 = g.double(), a.double()
        dot += float((g64 * a64).sum())
        g_sq += float((g64 * g64).sum())
        a_sq += float((a64 * a64).sum())
        diff_sq += float(((g64 - a64) ** 2).sum())
    if a_sq == 0.0:
        raise ValueError("the anchor gradient is zero: nothing to compare against (a batch without targets?)")
    cosine = dot / math.sqrt(g_sq * a_sq) if g_sq > 0 else 0.0
    return cosine, math.sqrt(diff_sq / a_sq)


def _timed_gradient(model: nn.Module, batch: dict[str, torch.Tensor], repeats: int,
                    **path: Any) -> tuple[list[torch.Tensor], float, float]:
    """The gradient, its loss, and the median seconds of `repeats` forward+backward passes."""
    device = next(model.parameters()).device
    result: dict[str, Any] = {}

    def run() -> None:
        result["grad"], result["loss"] = gradient_of(model, batch, **path)

    seconds = [timed(run, device) for _ in range(repeats)]
    return result["grad"], result["loss"], statistics.median(seconds)


def fidelity_rows(model: nn.Module, batch: dict[str, torch.Tensor], depths: Sequence[tuple[int, int]],
                  anchor: tuple[int, int], repeats: int = 1) -> tuple[FidelityRow, list[FidelityRow]]:
    """The anchor's row and one row per setting. The anchor runs first (and warms up the allocator)."""
    if not is_t2mlr(model):
        raise ValueError("gradient fidelity compares Jacobi depths: the model has no recurrence (a plain "
                         "Transformer or a baseline); pass a T²MLR model directory")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    with tqdm(total=len(depths) + 1, desc="gradients", unit="setting", dynamic_ncols=True) as bar:
        bar.set_postfix(depth=f"{anchor[0]}:{anchor[1]} (anchor)")
        anchor_grad, anchor_loss, anchor_seconds = _timed_gradient(
            model, batch, repeats, recurrence="jacobi", d_forward=anchor[0], d_backward=anchor[1])
        bar.update(1)
        anchor_row = FidelityRow(anchor[0], anchor[1], 1.0, 0.0, anchor_loss, anchor_seconds)
        rows = []
        for d_forward, d_backward in depths:
            bar.set_postfix(depth=f"{d_forward}:{d_backward}")
            grad, loss, seconds = _timed_gradient(model, batch, repeats, recurrence="jacobi",
                                                  d_forward=d_forward, d_backward=d_backward)
            cosine, distance = compare_gradients(grad, anchor_grad)
            rows.append(FidelityRow(d_forward, d_backward, cosine, distance, loss, seconds))
            del grad
            bar.update(1)
    return anchor_row, rows


def cheapest_above(rows: Sequence[FidelityRow], min_cosine: float) -> FidelityRow | None:
    """The fastest setting whose cosine reaches `min_cosine` (None when none does)."""
    passing = [row for row in rows if row.cosine >= min_cosine]
    return min(passing, key=lambda row: row.seconds) if passing else None


def _markdown(model_dir: Path, info: Any, anchor: FidelityRow, rows: Sequence[FidelityRow], batch_shape: tuple[int, int],
              min_cosine: float, figure: str) -> list[str]:
    body = [(f"{r.d_forward}", f"{r.d_backward}", f"{r.cosine:.4f}", f"{r.relative_l2:.4f}", f"{r.loss:.4f}",
             f"{r.seconds:.3f}", f"{r.seconds / anchor.seconds:.2f}×") for r in rows]
    body.append((f"{anchor.d_forward} (anchor)", f"{anchor.d_backward}", "1.0000", "0.0000", f"{anchor.loss:.4f}",
                 f"{anchor.seconds:.3f}", "1.00×"))
    best = cheapest_above(rows, min_cosine)
    choice = (f"Cheapest setting with cosine ≥ {min_cosine:g}: d_forward {best.d_forward}, d_backward "
              f"{best.d_backward} ({best.seconds:.3f} s, {best.seconds / anchor.seconds:.2f}× the anchor's time)."
              if best else f"No setting reaches cosine ≥ {min_cosine:g}.")
    return [
        "# Gradient fidelity of the Jacobi depths",
        "",
        f"Model {info.label} from `{model_dir}` ({info.parameters:,} parameters, {info.num_layers} blocks); one "
        f"batch of {batch_shape[0]} rows × {batch_shape[1]} tokens; anchor (d_forward, d_backward) = "
        f"({anchor.d_forward}, {anchor.d_backward}). Cosine and relative ℓ2 distance of the whole flattened "
        "gradient against the anchor's; seconds: one forward + backward pass (median of the repeats).",
        "",
        *table(["d_forward", "d_backward", "cosine", "relative ℓ2", "loss", "seconds", "time / anchor"], body),
        "",
        choice,
        "",
        f"![gradient fidelity]({figure})",
    ]


def run_gradient_fidelity(
    model_dir: str | Path, data: str | Path, out: str | Path, depths: Sequence[tuple[int, int]] | None = None,
    anchor: tuple[int, int] = (32, 32), batch_size: int = 4, seq_len: int | None = None, seed: int = 0,
    repeats: int = 1, device: str = "auto", dtype: str = "float32", min_cosine: float = 0.99,
    tokenizer: str | None = None, eos_token_id: int | None = None,
) -> dict[str, Any]:
    """Load the model and one batch of `batch_size` rows drawn at random (by `seed`) from `data`, compute
    every setting's gradient against the anchor's, and write gradient_fidelity.md/.json/.png to `out`."""
    depths = list(depths if depths is not None else parse_depths(DEFAULT_DEPTHS))
    model_dir = Path(model_dir)
    model, info = load_t2mlr_model(model_dir, device, dtype,
                                   "gradient fidelity compares Jacobi depths of a T²MLR model")
    data_cfg = data_config_for(data, model_dir, seq_len, tokenizer, eos_token_id)
    rows_data = build_dataset(data_cfg, model.config.vocab_size, name="--data")
    picked = draw_rows(len(rows_data), batch_size, seed, "--batch-size", data)
    batch = collate_for(rows_data, data_cfg, picked)
    anchor_row, rows = fidelity_rows(model, batch, depths, anchor, repeats)
    out = Path(out)
    figure = plot_gradient_fidelity(rows, anchor_row, out / FIGURE, title=f"{info.label}: gradient vs anchor "
                                    f"({anchor[0]}, {anchor[1]})")
    best = cheapest_above(rows, min_cosine)
    payload = {
        "model_dir": str(model_dir), "model": asdict(info), "data": str(data), "rows": picked,
        "batch_shape": list(batch["input_ids"].shape), "dtype": dtype, "device": str(next(model.parameters()).device),
        "repeats": repeats, "anchor": asdict(anchor_row), "settings": [asdict(r) for r in rows],
        "min_cosine": min_cosine, "cheapest_above_min_cosine": None if best is None else asdict(best),
    }
    md, js = write_result(out, STEM, _markdown(model_dir, info, anchor_row, rows, tuple(batch["input_ids"].shape),
                                               min_cosine, figure.name), payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}
