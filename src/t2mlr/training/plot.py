"""`t2mlr plot runs/x`: loss and fusion-gate curves from metrics.jsonl to one PNG.

The gate panel shows the raw scalars γ_cur and γ_rec; Φ uses tanh(γ), which has the same sign, so
the paper's finding (γ_rec ends positive, γ_cur negative) reads directly off the plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t2mlr.training.metrics import read_metrics

DPI = 120


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: files only, so it works on headless machines and in tests. Imported
    when a figure is drawn, so commands that draw none do not pay for matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, title: str = "") -> Path:
    """Lay the figure out (under `title`, when given), write it to `path` as a PNG and free it."""
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def _series(records: list[dict[str, Any]], split: str, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if record.get("split", "train") == split and isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw train/eval loss and γ_cur/γ_rec against step; returns the PNG path (default <run>/curves.png)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    fig, (ax_loss, ax_gate) = pyplot().subplots(1, 2, figsize=(11, 4))
    for split, key, label in (("train", "loss", "train loss"), ("eval", "eval_loss", "eval loss")):
        steps, values = _series(records, split, key)
        if steps:
            ax_loss.plot(steps, values, label=label, marker="o" if split == "eval" else None, markersize=3)
    ax_loss.set(xlabel="step", ylabel="loss (nats/token)", title=f"loss: {run_dir.name}")
    ax_loss.legend()
    drawn = False
    for key, label in (("gamma_cur", "γ_cur"), ("gamma_rec", "γ_rec")):
        steps, values = _series(records, "train", key)
        if steps:
            ax_gate.plot(steps, values, label=label)
            drawn = True
    ax_gate.axhline(0.0, color="grey", linewidth=0.5)
    ax_gate.set(xlabel="step", ylabel="gate value (Φ uses tanh γ)",
                title="fusion gates" if drawn else "fusion gates (none: plain transformer, or a Φ without γ)")
    if drawn:
        ax_gate.legend()
    return save_figure(fig, Path(out) if out else run_dir / "curves.png")
