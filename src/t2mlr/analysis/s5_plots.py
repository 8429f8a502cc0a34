"""Accuracy-vs-length figure of the S5-Retrieval experiment (the paper's Figure "s5_token_acc").

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

__all__ = ["plot_accuracy_vs_length"]

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
