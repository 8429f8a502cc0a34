"""Pass@1 bar chart of the reasoning finetunes (the paper's Figure "finetuning-multihop" layout).

One bar group per task, one bar per arm, the bar at pass@1 with its 95% interval as an error bar. When a
task has several seeds the bar is their mean, the interval spans the seeds' own intervals, and each seed's
pass@1 is a dot on the bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, works on headless machines and in tests
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_pass_at_1"]

# task label -> arm label -> one (pass@1, low, high) per seed
Bars = Mapping[str, Mapping[str, Sequence[tuple[float, float, float]]]]


def plot_pass_at_1(bars: Bars, path: str | Path, title: str = "Reasoning finetunes") -> Path:
    """Write the grouped bar chart to `path` (PNG) and return it."""
    tasks = list(bars)
    arms = list(dict.fromkeys(arm for task in tasks for arm in bars[task]))
    width = 0.8 / max(1, len(arms))
    fig, ax = plt.subplots(figsize=(3.4 + 1.6 * len(tasks) + 0.3 * len(arms), 3.6))
    for j, arm in enumerate(arms):
        xs, heights, lows, highs = [], [], [], []
        for i, task in enumerate(tasks):
            seeds = bars[task].get(arm)
            if not seeds:
                continue
            x = i - 0.4 + width * (j + 0.5)
            mean = sum(s[0] for s in seeds) / len(seeds)
            xs.append(x)
            heights.append(mean)
            lows.append(max(0.0, mean - min(s[1] for s in seeds)))  # float noise must not make a bar negative
            highs.append(max(0.0, max(s[2] for s in seeds) - mean))
            if len(seeds) > 1:
                ax.scatter([x] * len(seeds), [s[0] for s in seeds], color="black", s=8, zorder=3)
        ax.bar(xs, heights, width=width * 0.95, yerr=[lows, highs], capsize=3, label=arm, zorder=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("pass@1")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
