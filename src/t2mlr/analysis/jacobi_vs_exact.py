"""Jacobi training against exact training under the same truncated-BPTT budget (the paper's appendix
"Jacobi Approximation vs. Exact Recurrence in Training", table jacobi_vs_exact).

From one T²MLR training config three arms are trained with the project trainer:

* `jacobi`: `model.train_recurrence=jacobi model.d_forward=16 model.d_backward=4` (the paper's setting);
* `exact`: `model.train_recurrence=exact model.bptt_window=4`: the exact token-by-token path whose
  gradient reaches back through R as many tokens as the Jacobi arm's d_backward (docs/semantics.md
  §5.1); the paper holds exactly this budget fixed;
* `transformer`: the parameter-matched plain Transformer (`t2mlr.training.arms.matched_arm`).

Each T²MLR arm is then evaluated on the config's validation data on both paths: exact, and Jacobi at
the evaluation depth (default: the Jacobi arm's d_forward), with the early stop off. The table has the
paper's columns (loss and perplexity): Transformer | exact train, exact eval | exact train, Jacobi eval
| Jacobi train, exact eval | Jacobi train, Jacobi eval. The paper's claims checked: the Jacobi-trained
model is within 0.005 validation loss of the exact-trained one, and its Jacobi evaluation equals its
exact evaluation.

`run_jacobi_depths` (`t2mlr analyze jacobi-depths`) asks the second question of any trained model, at
every evaluation depth: on the same rows, the Jacobi path at d_forward = 2, 4, ..., 32 against the exact
path (loss, largest logit gap, argmax agreement at the scored positions, and how far the cache state is
from its fixed point). Position t is exact after t iterations, so on rows longer than the depth the gap
measures whether the trained model's recurrence has converged by then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from t2mlr.analysis.common import (
    causal_lm_loss,
    data_config_for,
    describe_model,
    draw_rows,
    fixed_depth,
    load_analysis_model,
    load_t2mlr_model,
    model_batches,
    model_inputs,
    validation_loss,
)
from t2mlr.analysis.figures import plot_jacobi_depths, plot_jacobi_vs_exact
from t2mlr.analysis.report import table, write_result
from t2mlr.model import is_t2mlr
from t2mlr.training.arms import TrainedArm, arm_from_tree, config_tree, matched_arm, train_arms, validation_batches
from t2mlr.training.data import build_dataset, count_targets
from t2mlr.training.metrics import read_metrics
from t2mlr.utils import IGNORE_INDEX, resolve_device

__all__ = ["PAPER_TOLERANCE", "DepthRow", "depth_rows", "run_jacobi_depths", "run_jacobi_vs_exact", "training_arms"]

STEM, FIGURE = "jacobi_vs_exact", "jacobi_vs_exact.png"
PAPER_TOLERANCE = 0.005  # the paper: Jacobi-trained models within this validation loss of exact-trained ones
CELLS = (  # (key, column title)
    ("transformer", "Transformer"),
    ("exact/exact", "T²MLR: exact train, exact eval"),
    ("exact/jacobi", "T²MLR: exact train, Jacobi eval"),
    ("jacobi/exact", "T²MLR: Jacobi train, exact eval"),
    ("jacobi/jacobi", "T²MLR: Jacobi train, Jacobi eval"),
)


@dataclass(frozen=True)
class Depths:
    d_forward: int
    d_backward: int
    eval_d_forward: int


def training_arms(tree: dict[str, Any], d_forward: int, d_backward: int, with_transformer: bool = True) -> list:
    """The Jacobi arm, the exact arm with the same backward budget, and (optionally) the Transformer."""
    if not 1 <= d_backward <= d_forward:
        raise ValueError(f"need 1 <= d_backward <= d_forward, got d_forward={d_forward}, d_backward={d_backward}")
    arms = [
        arm_from_tree(tree, "jacobi", f"T²MLR, Jacobi training ({d_forward}, {d_backward})",
                      ["model.train_recurrence=jacobi", f"model.d_forward={d_forward}",
                       f"model.d_backward={d_backward}", "model.bptt_window=null"]),
        arm_from_tree(tree, "exact", f"T²MLR, exact training (bptt_window={d_backward})",
                      ["model.train_recurrence=exact", f"model.bptt_window={d_backward}",
                       "model.activation_checkpointing=false"]),
    ]
    if with_transformer:
        arms.append(matched_arm(tree, "transformer", "transformer"))
    return arms


def evaluate_arms(trained: Sequence[TrainedArm], depths: Depths, max_batches: int | None) -> dict[str, dict[str, Any]]:
    """Validation loss of every (training arm, evaluation path) cell of the table."""
    batches = validation_batches(trained[0].arm.config, max_batches)
    jacobi_call = {"recurrence": "jacobi", "d_forward": depths.eval_d_forward,
                   "d_backward": min(depths.d_backward, depths.eval_d_forward)}
    plan = []
    for arm in trained:
        if arm.arm.name == "transformer":
            plan.append(("transformer", arm, {}))
        else:
            plan.append((f"{arm.arm.name}/exact", arm, {"recurrence": "exact"}))
            plan.append((f"{arm.arm.name}/jacobi", arm, jacobi_call))
    cells: dict[str, dict[str, Any]] = {}
    loaded: dict[str, Any] = {}
    for key, arm, call in tqdm(plan, desc="evaluate", unit="cell", dynamic_ncols=True):
        if arm.arm.name not in loaded:
            loaded.clear()
            loaded[arm.arm.name] = load_analysis_model(arm.model_dir, device=str(resolve_device(arm.arm.config.train.device)))
        model = loaded[arm.arm.name]
        cells[key] = {**validation_loss(model, batches, **call), "path": call.get("recurrence", "plain"),
                      "parameters": describe_model(model).parameters}
    return cells


def _eval_curves(trained: Sequence[TrainedArm]) -> dict[str, list[tuple[int, float]]]:
    """Each arm's periodic validation loss from its metrics.jsonl (the trainer's eval path)."""
    return {arm.arm.label: [(int(r["step"]), float(r["eval_loss"])) for r in read_metrics(arm.run_dir)
                            if r.get("split") == "eval" and isinstance(r.get("eval_loss"), (int, float))]
            for arm in trained}


def claims(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The paper's two claims as numbers: the training gap (Jacobi-trained minus exact-trained, both
    evaluated exactly) and the evaluation gap (the Jacobi-trained model, Jacobi minus exact eval)."""
    train_gap = cells["jacobi/exact"]["loss"] - cells["exact/exact"]["loss"]
    eval_gap = cells["jacobi/jacobi"]["loss"] - cells["jacobi/exact"]["loss"]
    return {"train_gap": train_gap, "train_gap_within_tolerance": abs(train_gap) <= PAPER_TOLERANCE,
            "eval_gap": eval_gap, "tolerance": PAPER_TOLERANCE}


def _cell(cells: dict[str, dict[str, Any]], key: str) -> str:
    if key not in cells:
        return "–"
    return f"{cells[key]['loss']:.4f} ({cells[key]['ppl']:.2f})"


def _markdown(config: str, depths: Depths, trained: Sequence[TrainedArm], cells: dict[str, dict[str, Any]],
              checks: dict[str, Any], figure: str) -> list[str]:
    present = [(key, title) for key, title in CELLS if key in cells]
    cfg = trained[0].arm.config
    tokens = cells[present[0][0]]["tokens"]
    arms = [(a.arm.label, f"{a.arm.config.train.max_steps:,}", f"{a.seconds / 60:.1f} min",
             f"`{a.run_dir}`") for a in trained]
    verdict = "within" if checks["train_gap_within_tolerance"] else "outside"
    return [
        "# Jacobi vs exact training (same truncated-BPTT budget)",
        "",
        f"Config `{config}`; T²MLR({cfg.model.l_start},{cfg.model.l_end}); Jacobi arm trained at (d_forward, "
        f"d_backward) = ({depths.d_forward}, {depths.d_backward}); exact arm trained with bptt_window = "
        f"{depths.d_backward}; Jacobi evaluation at d_forward = {depths.eval_d_forward} (no early stop). "
        f"Validation loss in nats per token over {tokens:,} tokens of eval.data (perplexity in parentheses).",
        "",
        *table([title for _, title in present], [[_cell(cells, key) for key, _ in present]]),
        "",
        f"- Jacobi-trained minus exact-trained (both evaluated exactly): {checks['train_gap']:+.2e} ({verdict} the "
        f"paper's ±{PAPER_TOLERANCE})",
        f"- Jacobi-trained model, Jacobi minus exact evaluation: {checks['eval_gap']:+.2e}",
        "",
        *table(["arm", "steps", "training time", "run directory"], arms),
        "",
        f"![Jacobi vs exact]({figure})",
    ]


def run_jacobi_vs_exact(
    config: str | Path, out: str | Path, overrides: Sequence[str] = (), d_forward: int = 16, d_backward: int = 4,
    eval_d_forward: int | None = None, eval_batches: int | None = None, resume: bool = False,
    with_transformer: bool = True, workers: int = 1,
) -> dict[str, Any]:
    """Train the arms (in turn), evaluate each on both paths, write jacobi_vs_exact.md/.json/.png to OUT."""
    depths = Depths(d_forward, d_backward, d_forward if eval_d_forward is None else eval_d_forward)
    if depths.eval_d_forward < 1:
        raise ValueError(f"--eval-d-forward must be >= 1, got {depths.eval_d_forward}")
    tree = config_tree(config, overrides, t2mlr=True)
    arms = training_arms(tree, d_forward, d_backward, with_transformer)
    out = Path(out)
    trained = list(train_arms(arms, out, resume=resume, workers=workers)[0].values())
    cells = evaluate_arms(trained, depths, eval_batches)
    checks = claims(cells)
    figure = plot_jacobi_vs_exact({title: cells[key]["loss"] for key, title in CELLS if key in cells},
                                  _eval_curves(trained), out / FIGURE)  # bars in the table's column order
    payload = {
        "config": str(config), "overrides": list(overrides),
        "depths": asdict(depths), "cells": cells, "claims": checks,
        "arms": [{"name": a.arm.name, "label": a.arm.label, "run_dir": str(a.run_dir), "steps": a.arm.config.train.max_steps,
                  "train_seconds": a.seconds} for a in trained],
    }
    md, js = write_result(out, STEM, _markdown(str(config), depths, trained, cells, checks, figure.name), payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}


# ---------------------------------------------------------------------------------------------- depths of a trained model

DEPTHS_STEM, DEPTHS_FIGURE = "jacobi_depths", "jacobi_depths.png"


@dataclass
class DepthRow:
    """A trained model on the Jacobi path at one depth, against its exact path on the same rows."""

    d_forward: int
    loss: float
    loss_gap: float  # Jacobi minus exact, nats per scored token
    max_logit_gap: float  # max |Δ logit| over real positions
    argmax_agreement: float  # share of scored positions where the Jacobi argmax is the exact one
    state_gap: float  # max over rows of ||R_d − R_exact|| / ||R_exact||, R after each row's last real token


def _path_outputs(model: Any, batches: Sequence[dict[str, Any]], **path: Any) -> list[tuple[Any, Any, Any, Any]]:
    """(logits, labels, real-position mask, last state) of every batch on one path, early stop off."""
    outputs = []
    with torch.no_grad(), fixed_depth(model):
        for batch in batches:
            inputs = model_inputs(model, batch)
            labels = inputs.pop("labels")
            out = model(**inputs, **path)
            real = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])).bool()
            outputs.append((out.logits.double(), labels, real, out.recurrent_state.double()))
    return outputs


def _compare(exact: Sequence[tuple[Any, Any, Any, Any]], other: Sequence[tuple[Any, Any, Any, Any]],
             d_forward: int, exact_loss: float) -> DepthRow:
    loss_sum = targets = agree = 0.0
    logit_gap = state_gap = 0.0
    for (e_logits, labels, real, e_state), (j_logits, _, _, j_state) in zip(exact, other):
        scored = labels[:, 1:] != IGNORE_INDEX
        n = int(scored.sum())
        loss_sum += float(causal_lm_loss(j_logits, labels)) * n
        targets += n
        agree += float((j_logits[:, :-1].argmax(-1) == e_logits[:, :-1].argmax(-1))[scored].sum())
        logit_gap = max(logit_gap, float((j_logits - e_logits).abs().amax(-1)[real].max()))
        state_gap = max(state_gap, float(((j_state - e_state).norm(dim=-1) / e_state.norm(dim=-1).clamp_min(1e-30)).max()))
    loss = loss_sum / targets
    return DepthRow(d_forward, loss, loss - exact_loss, logit_gap, agree / targets, state_gap)


def depth_rows(model: Any, batches: Sequence[dict[str, Any]], depths: Sequence[int]) -> tuple[float, list[DepthRow]]:
    """The exact path's loss on `batches` and one row per Jacobi depth (see `DepthRow`)."""
    if not is_t2mlr(model):
        raise ValueError("Jacobi depths compare a T²MLR model's two paths: the model has no recurrence")
    if not depths or any(d < 1 for d in depths):
        raise ValueError(f"depths must be integers >= 1, got {list(depths)}")
    exact = _path_outputs(model, batches, recurrence="exact")
    n_targets = sum(count_targets({"labels": labels}) for _, labels, _, _ in exact)
    if n_targets == 0:
        raise ValueError("the rows hold no scored token")
    exact_loss = sum(float(causal_lm_loss(logits, labels)) * count_targets({"labels": labels})
                     for logits, labels, _, _ in exact) / n_targets
    rows = []
    for d in tqdm(depths, desc="Jacobi depths", unit="depth", dynamic_ncols=True):
        # d_backward only shapes gradients; 1 is valid at every depth
        jacobi = _path_outputs(model, batches, recurrence="jacobi", d_forward=d, d_backward=1)
        rows.append(_compare(exact, jacobi, d, exact_loss))
    return exact_loss, rows


def _depths_markdown(model_dir: Path, info: Any, exact_loss: float, rows: Sequence[DepthRow], shape: tuple[int, int],
                     figure: str) -> list[str]:
    body = [(f"{r.d_forward}", f"{r.loss:.4f}", f"{r.loss_gap:+.2e}", f"{r.max_logit_gap:.2e}",
             f"{100 * r.argmax_agreement:.2f}%", f"{r.state_gap:.2e}") for r in rows]
    return [
        "# Jacobi depths of a trained model against its exact path",
        "",
        (f"Model {info.label} from `{model_dir}`; {shape[0]} rows of up to {shape[1]} tokens; exact-path loss "
         f"{exact_loss:.4f} nats per scored token. For each Jacobi depth (d_forward, no early stop): its loss, the "
         "gap to the exact loss, the largest |Δ logit| at any real position, how often its argmax equals the exact "
         "path's at the scored positions, and the largest relative distance of the state after a row's last token "
         "from the exact one (how far the cache is from its fixed point)."),
        "",
        *table(["d_forward", "loss", "− exact", "max |Δ logit|", "argmax = exact", "state distance"], body),
        "",
        f"![Jacobi depths]({figure})",
    ]


def run_jacobi_depths(
    model_dir: str | Path, data: str | Path, out: str | Path, depths: Sequence[int] = (2, 4, 8, 16, 32),
    rows: int = 64, batch_size: int = 64, seed: int = 0, seq_len: int | None = None, device: str = "auto",
    tokenizer: str | None = None, eos_token_id: int | None = None,
) -> dict[str, Any]:
    """Evaluate a trained T²MLR model on `rows` rows drawn at random (by `seed`) from `data` on the exact path
    and on the Jacobi path at each depth; write jacobi_depths.md/.json/.png to `out`."""
    model_dir = Path(model_dir)
    model, info = load_t2mlr_model(model_dir, device, "float32", "Jacobi depths need a T²MLR model")
    cfg = data_config_for(data, model_dir, seq_len, tokenizer, eos_token_id)
    dataset = build_dataset(cfg, model.config.vocab_size, name="--data")
    picked = draw_rows(len(dataset), rows, seed, "--rows", data)
    batches = model_batches(dataset, picked, batch_size, cfg)
    exact_loss, depth_table = depth_rows(model, batches, list(depths))
    out = Path(out)
    figure = plot_jacobi_depths(depth_table, out / DEPTHS_FIGURE, title=f"{info.label}: Jacobi depth vs exact path")
    shape = (rows, max(int(b["input_ids"].shape[1]) for b in batches))
    payload = {"model_dir": str(model_dir), "model": asdict(info), "data": str(data), "rows": picked,
               "exact_loss": exact_loss, "depths": [asdict(r) for r in depth_table]}
    md, js = write_result(out, DEPTHS_STEM, _depths_markdown(model_dir, info, exact_loss, depth_table, shape,
                                                              figure.name), payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}
