"""Figures of the analyses, each in the layout of the paper's figure or table it reproduces.

* `plot_gradient_fidelity` (figure grad_analysis): cosine similarity and relative l2 distance to the
  anchor against d_forward, one line per d_backward, plus the seconds per forward+backward pass.
* `plot_jacobi_vs_exact` (table jacobi_vs_exact): the five validation losses side by side, and each
  arm's validation loss during training.
* `plot_probes` (table future-token-prediction): probe loss against block, one line per model and offset,
  the recurrent blocks shaded.
* `plot_jacobi_depths`: a trained model's Jacobi path against its exact path at each evaluation depth.
* `plot_gates` (figure gamma-step): γ_cur and γ_rec against training step, one line per run.
* `plot_placement` (figure loss_vs_lstart, table layer_location): validation loss against l_start, the
  plain Transformer as a horizontal line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines and in tests
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

__all__ = ["plot_gates", "plot_gradient_fidelity", "plot_jacobi_depths", "plot_jacobi_vs_exact", "plot_placement",
           "plot_probes"]

DPI = 120


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_gradient_fidelity(rows: Sequence[Any], anchor: Any, path: str | Path, title: str = "") -> Path:
    """Three panels over d_forward (log2 axis): cosine, relative l2, seconds; one line per d_backward."""
    by_backward: dict[int, list[Any]] = {}
    for row in rows:
        by_backward.setdefault(row.d_backward, []).append(row)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("cosine", "cosine similarity to the anchor"), ("relative_l2", "relative ℓ2 distance to the anchor"),
              ("seconds", "seconds per forward + backward"))
    for ax, (key, ylabel) in zip(axes, panels):
        for backward, group in sorted(by_backward.items()):
            group = sorted(group, key=lambda r: r.d_forward)
            ax.plot([r.d_forward for r in group], [getattr(r, key) for r in group], marker="o",
                    label=f"d_backward = {backward}")
        ax.plot([anchor.d_forward], [getattr(anchor, key)], marker="*", markersize=12, color="black", linestyle="none",
                label=f"anchor ({anchor.d_forward}, {anchor.d_backward})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_forward")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_jacobi_vs_exact(losses: Mapping[str, float], curves: Mapping[str, Sequence[tuple[int, float]]],
                         path: str | Path) -> Path:
    """Left: the table's validation losses as bars in the given order (values printed; grey for the
    Transformer, one colour per training path); right: validation loss during training."""
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.2, 1]})
    names = list(losses)
    values = [losses[n] for n in names]
    colours = ["C0" if "Jacobi train" in n else "C1" if "exact train" in n else "0.6" for n in names]
    drawn = bars.bar(range(len(names)), values, color=colours)  # grey: the Transformer; colour: training path
    bars.bar_label(drawn, labels=[f"{v:.4f}" for v in values], fontsize=8)
    bars.set_xticks(range(len(names)), [n.replace(": ", ":\n").replace(", ", ",\n") for n in names], fontsize=8)
    low, high = min(values), max(values)
    margin = max(high - low, 1e-3)
    bars.set_ylim(low - 2 * margin, high + margin)
    bars.set_ylabel("validation loss (nats/token)")
    bars.set_title("final validation loss")
    drawn_curves = 0
    for label, points in curves.items():
        if points:
            lines.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
            drawn_curves += 1
    lines.set_xlabel("training step")
    lines.set_ylabel("validation loss (the run's eval path)")
    lines.set_title("during training")
    lines.grid(alpha=0.3)
    if drawn_curves:
        lines.legend(fontsize=8)
    else:
        lines.text(0.5, 0.5, "no periodic evaluation logged\n(eval.every = 0)", ha="center", va="center",
                   transform=lines.transAxes)
    return _save(fig, path)


def plot_jacobi_depths(rows: Sequence[Any], path: str | Path, title: str = "") -> Path:
    """Three panels over d_forward (log2 axis): the loss gap to the exact path, the argmax agreement at the
    scored positions, and the relative distance of the last state from the exact one (log axis)."""
    depths = [r.d_forward for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("loss_gap", "loss − exact loss (nats/token)", "linear"),
              ("argmax_agreement", "argmax = exact (share of scored positions)", "linear"),
              ("state_gap", "‖R_d − R_exact‖ / ‖R_exact‖ (last token, max over rows)", "log"))
    for ax, (key, ylabel, scale) in zip(axes, panels):
        values = [getattr(r, key) for r in rows]
        ax.plot(depths, [max(v, 1e-12) for v in values] if scale == "log" else values, marker="o")
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        ax.set_xlabel("Jacobi d_forward")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_probes(curves: Mapping[tuple[str, int], Mapping[int, float]], path: str | Path, num_layers: int,
                placement: tuple[int, int] | None = None) -> Path:
    """Probe loss against block: one colour per model, one line style per offset; each tick also names
    the layer counted back from the LM head (ℓ−1 = the last block), as the paper's table does."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    models = list(dict.fromkeys(model for model, _ in curves))
    offsets = sorted({offset for _, offset in curves})
    styles = ["-", "--", ":", "-."]
    if placement is not None:
        ax.axvspan(placement[0] - 0.5, placement[1] + 0.5, color="0.92", zorder=0, label="T²MLR recurrent blocks")
    for (model, offset), losses in curves.items():
        blocks = sorted(losses)
        ax.plot(blocks, [losses[b] for b in blocks], marker="o", markersize=3,
                color=f"C{models.index(model)}", linestyle=styles[offsets.index(offset) % len(styles)],
                label=f"{model}, x(t+{offset})")
    probed = sorted({b for losses in curves.values() for b in losses})
    ax.set_xticks(probed, [f"{b}\nℓ−{num_layers + 1 - b}" for b in probed])
    ax.set_xlim(probed[0] - 0.6, probed[-1] + 0.6)
    ax.set_xlabel("block (top) = layer counted back from the LM head (bottom; ℓ−1 after the final norm)")
    ax.set_ylabel("held-out probe loss (nats/token)")
    ax.set_title("future-token probes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_gates(runs: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float]]], path: str | Path) -> Path:
    """γ_cur and γ_rec against step; one run: both gates on one panel, several runs: one panel per gate."""
    if len(runs) == 1:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        (name, (steps, cur, rec)), = runs.items()
        ax.plot(steps, cur, label="γ_cur")
        ax.plot(steps, rec, label="γ_rec")
        ax.set_title(f"fusion gates: {Path(name).name or name}")
        axes = [ax]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
        for index, (name, (steps, cur, rec)) in enumerate(runs.items()):
            axes[0].plot(steps, cur, color=f"C{index}", label=name)
            axes[1].plot(steps, rec, color=f"C{index}", label=name)
        axes[0].set_title("γ_cur")
        axes[1].set_title("γ_rec")
    for ax in axes:
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set_xlabel("training step")
        ax.set_ylabel("gate value (Φ uses tanh γ)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_placement(rows: Sequence[Mapping[str, Any]], baseline_loss: float | None, path: str | Path,
                   num_layers: int, width: int | None = None) -> Path:
    """Validation loss against l_start, each point labelled (l_start, l_end); the Transformer dashed."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ordered = sorted(rows, key=lambda r: r["l_start"])
    ax.plot([r["l_start"] for r in ordered], [r["loss"] for r in ordered], marker="o", label="T²MLR")
    for r in ordered:
        ax.annotate(f"({r['l_start']},{r['l_end']})", (r["l_start"], r["loss"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    if baseline_loss is not None:
        ax.axhline(baseline_loss, color="black", linestyle="--", linewidth=1, label="Transformer (matched)")
    ax.set_xlim(0.5, num_layers + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("l_start" + (f" (D = {width})" if width else " (l_end = L + 1 − l_start)"))
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"recurrence placement, {num_layers} blocks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
