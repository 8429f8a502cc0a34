"""Where to put the recurrent block: validation loss against l_start (the paper's figure
loss_vs_lstart) and early / middle / late blocks at a fixed width D (table layer_location).

From one T²MLR training config, one arm per placement is trained with the project trainer
(`model.l_start=S model.l_end=E`, everything else as configured), plus the parameter-matched plain
Transformer (T²MLR's parameter count does not depend on the placement, so one baseline serves every
arm), or an already trained baseline given with `baseline`. Each model is evaluated on the config's
validation data, T²MLR on the exact path.

Placements from `starts`:

* without a width, l_start S recurs over S .. L + 1 - S, the paper's symmetric sweep ((1,30), (5,26),
  (9,22), (13,18), (15,16) on 30 blocks);
* with a width D, S recurs over S .. S + D - 1; the words `early`, `middle` and `late` stand for the
  first D blocks, the D blocks in the middle and the last D blocks (the paper's fixed-width ablation).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from t2mlr.analysis.common import (
    describe_model,
    load_analysis_model,
    validation_loss,
)
from t2mlr.analysis.report import table, write_result
from t2mlr.settings import check_block_range
from t2mlr.training.arms import arm_from_tree, config_tree, matched_arm, train_arms, validation_batches
from t2mlr.training.config import config_from_tree
from t2mlr.training.model_factory import base_config
from t2mlr.utils import resolve_device

__all__ = ["parse_starts", "placements", "position_name", "run_placement"]

STEM, FIGURE = "placement", "placement.png"
NAMED_STARTS = ("early", "middle", "late")


def parse_starts(text: str) -> list[int | str]:
    """"1,5,9" → [1, 5, 9]; the words early, middle, late are kept as words (they need a width)."""
    items: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part in NAMED_STARTS:
            items.append(part)
            continue
        try:
            items.append(int(part))
        except ValueError as err:
            raise ValueError(f"--starts: expected block numbers (1-based) or early/middle/late, got {part!r}") from err
    if not items:
        raise ValueError(f"--starts: expected at least one l_start, got {text!r}")
    return items


def placements(num_layers: int, starts: Sequence[int | str], width: int | None = None) -> list[tuple[int, int]]:
    """The (l_start, l_end) of every start (see the module docstring), checked against the depth."""
    if width is not None and not 1 <= width <= num_layers:
        raise ValueError(f"--width must lie in [1, {num_layers}] (the model has {num_layers} blocks), got {width}")
    result = []
    for start in starts:
        if isinstance(start, str):
            if width is None:
                raise ValueError(f"--starts {start}: the words early/middle/late need --width D")
            s = {"early": 1, "middle": (num_layers - width) // 2 + 1, "late": num_layers - width + 1}[start]
        else:
            s = start
        e = num_layers + 1 - s if width is None else s + width - 1
        try:
            check_block_range(s, e, num_layers, ("l_start", "l_end"))
        except ValueError as err:
            need = f"l_start <= {(num_layers + 1) // 2}" if width is None else f"l_start <= {num_layers - width + 1}"
            raise ValueError(f"--starts {start}: placement ({s},{e}) does not fit ({need}): {err}") from err
        result.append((s, e))
    return list(dict.fromkeys(result))


def position_name(l_start: int, l_end: int, num_layers: int) -> str:
    """full / early / late / middle, as the paper's tables name placements."""
    if l_start == 1 and l_end == num_layers:
        return "full"
    if l_start == 1:
        return "early"
    if l_end == num_layers:
        return "late"
    return "middle"


def _markdown(config: str, num_layers: int, width: int | None, rows: list[dict[str, Any]],
              baseline: dict[str, Any] | None, figure: str, eval_tokens: int) -> list[str]:
    base_loss = None if baseline is None else baseline["loss"]
    body = []
    for r in rows:
        delta = "–" if base_loss is None else f"{r['loss'] - base_loss:+.4f}"
        body.append((f"T²MLR({r['l_start']},{r['l_end']})", r["l_start"], r["width"], r["position"],
                     f"{r['loss']:.4f}", f"{r['ppl']:.2f}", delta, f"{r['train_seconds'] / 60:.1f} min"))
    if baseline is not None:
        body.append((baseline["label"], "–", "–", "–", f"{baseline['loss']:.4f}", f"{baseline['ppl']:.2f}", "0",
                     "–" if baseline["train_seconds"] is None else f"{baseline['train_seconds'] / 60:.1f} min"))
    sweep = f"fixed width D = {width}" if width else "l_end = L + 1 − l_start (the paper's symmetric sweep)"
    return [
        "# Recurrence placement",
        "",
        f"Config `{config}` ({num_layers} blocks); {sweep}. Validation loss in nats per token over "
        f"{eval_tokens:,} tokens of eval.data, T²MLR on the exact path; Δ against the plain Transformer.",
        "",
        *table(["model", "l_start", "D", "position", "val loss", "ppl", "Δ vs Transformer", "training time"], body),
        "",
        f"![validation loss vs l_start]({figure})",
    ]


def run_placement(
    config: str | Path, out: str | Path, starts: Sequence[int | str], width: int | None = None,
    overrides: Sequence[str] = (), baseline: str | Path | None = None, with_transformer: bool = True,
    eval_batches: int | None = None, resume: bool = False, workers: int = 1,
) -> dict[str, Any]:
    """Train one arm per placement (and the Transformer unless a `baseline` model directory is given or
    `with_transformer` is False), evaluate them, write placement.md/.json/.png to OUT."""
    from t2mlr.analysis.figures import plot_placement

    tree = config_tree(config, overrides, t2mlr=True)
    cfg = config_from_tree(tree)
    num_layers = int(base_config(cfg.model).num_hidden_layers)
    spots = placements(num_layers, starts, width)
    arms = [arm_from_tree(tree, f"t2mlr_{s}_{e}", f"T²MLR({s},{e})", [f"model.l_start={s}", f"model.l_end={e}"])
            for s, e in spots]
    if baseline is None and with_transformer:
        arms.append(matched_arm(tree, "transformer", "transformer"))
    out = Path(out)
    trained = train_arms(arms, out, resume=resume, workers=workers)[0].values()
    batches = validation_batches(cfg, eval_batches)
    rows, base_row = [], None
    for arm in tqdm(trained, desc="evaluate", unit="model", dynamic_ncols=True):
        model = load_analysis_model(arm.model_dir, device=str(resolve_device(cfg.train.device)))
        if arm.arm.name == "transformer":
            base_row = {**validation_loss(model, batches), "label": arm.arm.label, "model_dir": str(arm.model_dir),
                        "train_seconds": arm.seconds}
            continue
        s, e = model.config.l_start, model.config.l_end
        rows.append({"l_start": s, "l_end": e, "width": e - s + 1, "position": position_name(s, e, num_layers),
                     **validation_loss(model, batches, recurrence="exact"), "model_dir": str(arm.model_dir),
                     "train_seconds": arm.seconds, "parameters": describe_model(model).parameters})
    if baseline is not None:
        model = load_analysis_model(baseline, device=str(resolve_device(cfg.train.device)))
        info = describe_model(model)
        if info.recurrent:
            raise ValueError(f"--baseline {baseline} is a {info.label}: expected a plain Transformer model directory")
        base_row = {**validation_loss(model, batches), "label": f"Transformer (given: {baseline})",
                    "model_dir": str(baseline), "train_seconds": None}
    figure = plot_placement(rows, None if base_row is None else base_row["loss"], out / FIGURE, num_layers, width)
    payload = {"config": str(config), "overrides": list(overrides), "num_layers": num_layers, "width": width,
               "placements": rows, "transformer": base_row}
    tokens = rows[0]["tokens"] if rows else 0
    md, js = write_result(out, STEM, _markdown(str(config), num_layers, width, rows, base_row, figure.name, tokens),
                          payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}
