"""Figures of the S5-Retrieval experiment: accuracy vs length (the paper's Figure "s5_token_acc"), also over
seeds, and the evidence study's summaries (cosine to the anchor over the depth grid, accuracy by evaluation path).

Top: sequence exact match; bottom: per-token accuracy (scored after the delimiter); x: number of
actions N; one line per model. The training range is shaded and its upper end dotted, so
in-distribution and length-generalisation results read apart at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, works on headless machines and in tests
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

__all__ = ["plot_accuracy_by_depth", "plot_accuracy_over_seeds", "plot_accuracy_vs_length", "plot_cosine_grid"]

Curve = Mapping[int, tuple[float, float]]  # N -> (exact match, token accuracy)


def _panel(ax: plt.Axes, curves: Mapping[str, Curve], metric: int, ylabel: str, train_range: tuple[int, int]) -> None:
    lo, hi = train_range
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.92", zorder=0, label=f"training N {lo}–{hi}")
    ax.axvline(hi + 0.5, color="0.25", linestyle=":", linewidth=1.5, label="max N seen in training")
    for name, curve in curves.items():
        ns = sorted(curve)
        ax.plot(ns, [curve[n][metric] for n in ns], marker="o", markersize=3, linewidth=1.5, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)


def plot_accuracy_vs_length(
    curves: Mapping[str, Curve], train_range: tuple[int, int], path: str | Path, title: str = "S5-Retrieval"
) -> Path:
    """Write the two-panel PNG to `path` and return it."""
    if not curves:
        raise ValueError("no model curves to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
    _panel(top, curves, 0, "sequence exact match", train_range)
    _panel(bottom, curves, 1, "per-token accuracy", train_range)
    bottom.set_xlabel("number of actions N")
    top.set_title(title)
    top.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


SeedCurves = Mapping[int, Mapping[int, float]]  # seed -> N -> value


def _mean_band(curves: SeedCurves) -> tuple[list[int], list[float], list[float], list[float]]:
    ns = sorted({n for curve in curves.values() for n in curve})
    values = [[curve[n] for curve in curves.values() if n in curve] for n in ns]
    return ns, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot_accuracy_over_seeds(arms: Mapping[str, tuple[SeedCurves, SeedCurves]], train_range: tuple[int, int],
                             path: str | Path, title: str = "S5-Retrieval") -> Path:
    """The two-panel accuracy-vs-N figure over several seeds: per arm the mean over seeds as a line and the
    range (min to max) as a band; `arms`: label -> (exact-match curves, token-accuracy curves) by seed."""
    if not arms:
        raise ValueError("no arm curves to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 7.5), sharex=True)
    lo, hi = train_range
    for ax, index, ylabel in ((top, 0, "sequence exact match"), (bottom, 1, "per-token accuracy")):
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.92", zorder=0)
        ax.axvline(hi + 0.5, color="0.25", linestyle=":", linewidth=1.5)
        for colour, (label, curves) in enumerate(arms.items()):
            ns, mean, low, high = _mean_band(curves[index])
            seeds = len(curves[index])
            ax.plot(ns, mean, marker="o", markersize=3, linewidth=1.5, color=f"C{colour % 10}",
                    label=f"{label} ({seeds} seed{'s' if seeds != 1 else ''})")
            ax.fill_between(ns, low, high, color=f"C{colour % 10}", alpha=0.15, linewidth=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    bottom.set_xlabel(f"number of actions N (shaded: training N {lo}–{hi}; lines: mean over seeds, bands: min–max)")
    top.set_title(title)
    top.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cosine_grid(panels: Mapping[str, Mapping[tuple[int, int], list[float]]], path: str | Path,
                     anchor: str) -> Path:
    """Cosine to the anchor against d_forward (log2), one line per d_backward, one panel per model/checkpoint;
    `panels`: title -> (d_forward, d_backward) -> cosine per seed (mean drawn, min–max as error bars)."""
    if not panels:
        raise ValueError("no gradient-fidelity results to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = min(2, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 3.8 * rows), squeeze=False, sharey=True)
    for ax, (title, cells) in zip(axes.flat, panels.items()):
        for colour, backward in enumerate(sorted({b for _, b in cells})):
            forwards = sorted(f for f, b in cells if b == backward)
            values = [cells[(f, backward)] for f in forwards]
            mean = [sum(v) / len(v) for v in values]
            errors = [[m - min(v) for m, v in zip(mean, values)], [max(v) - m for m, v in zip(mean, values)]]
            ax.errorbar(forwards, mean, yerr=errors, marker="o", markersize=4, capsize=3, color=f"C{colour}",
                        label=f"d_backward = {backward}")
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("d_forward")
        ax.set_ylabel(f"cosine to {anchor} gradient", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_accuracy_by_depth(arms: Mapping[str, Mapping[str, list[float]]], path: str | Path, ylabel: str) -> Path:
    """A trained model's accuracy on each evaluation path: `arms`: label -> path name ("exact", "Jacobi 2", ...)
    -> value per seed; points are the mean, error bars min–max, paths in the given order."""
    if not arms:
        raise ValueError("no depth results to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for colour, (label, by_path) in enumerate(arms.items()):
        names = list(by_path)
        mean = [sum(v) / len(v) for v in by_path.values()]
        errors = [[m - min(v) for m, v in zip(mean, by_path.values())],
                  [max(v) - m for m, v in zip(mean, by_path.values())]]
        ax.errorbar(range(len(names)), mean, yerr=errors, marker="o", capsize=3, color=f"C{colour % 10}", label=label)
        ax.set_xticks(range(len(names)), names)
    ax.set_xlabel("evaluation path (Jacobi: d_forward)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
