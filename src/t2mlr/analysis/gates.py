"""Fusion-gate trajectories: γ_cur and γ_rec against training step, from the metrics.jsonl of one or
more runs (the paper's appendix "Learned gating behavior", figure gamma-step: γ_rec ends positive and
γ_cur negative, on every task the authors trained).

The trainer logs both scalars with every training record of a T²MLR run. Φ uses tanh(γ), which has the
sign of γ, so the paper's finding reads directly off the raw values. A run without both values (a plain
Transformer, another baseline, or a T²MLR run whose `fusion` variant is not the paper's gated Φ: only
`fusion="gated"` has γ_cur and γ_rec) is reported as such and left out of the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from t2mlr.analysis.report import table, write_result
from t2mlr.training.metrics import read_metrics

__all__ = ["GateTrajectory", "NoGatesError", "gate_trajectory", "run_gates"]

STEM, FIGURE = "gates", "gates.png"
GATES = ("gamma_cur", "gamma_rec")


class NoGatesError(ValueError):
    """None of the runs logged fusion gates (plain Transformers or other baselines only)."""


@dataclass
class GateTrajectory:
    """One run's gates by step (train records only)."""

    run: str
    steps: list[int] = field(default_factory=list)
    gamma_cur: list[float] = field(default_factory=list)
    gamma_rec: list[float] = field(default_factory=list)

    @property
    def final(self) -> tuple[float, float]:
        return self.gamma_cur[-1], self.gamma_rec[-1]

    def matches_paper(self) -> bool:
        """γ_rec ends positive and γ_cur negative."""
        cur, rec = self.final
        return rec > 0 > cur


def gate_trajectory(run_dir: str | Path) -> GateTrajectory | None:
    """The gates a run logged, by step; None when its records carry no gate values (no fusion)."""
    run_dir = Path(run_dir)
    trajectory = GateTrajectory(run=str(run_dir))
    for record in read_metrics(run_dir):
        if record.get("split", "train") != "train" or not all(_number(record.get(g)) for g in GATES):
            continue
        trajectory.steps.append(int(record["step"]))
        trajectory.gamma_cur.append(float(record["gamma_cur"]))
        trajectory.gamma_rec.append(float(record["gamma_rec"]))
    return trajectory if trajectory.steps else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _markdown(trajectories: Sequence[GateTrajectory], skipped: Sequence[str], figure: str) -> list[str]:
    rows = []
    for t in trajectories:
        cur, rec = t.final
        rows.append((f"`{t.run}`", f"{t.steps[-1]:,}", f"{cur:+.4f}", f"{rec:+.4f}", f"{math.tanh(cur):+.4f}",
                     f"{math.tanh(rec):+.4f}", "yes" if t.matches_paper() else "no"))
    lines = [
        "# Fusion gates over training",
        "",
        "γ_cur and γ_rec at the last logged step of each run (Φ uses tanh γ). The paper: γ_rec ends positive and "
        "γ_cur negative.",
        "",
        *table(["run", "last step", "γ_cur", "γ_rec", "tanh γ_cur", "tanh γ_rec", "γ_rec > 0 > γ_cur"], rows),
        "",
    ]
    lines += [f"- {message}" for message in skipped]
    lines += ["", f"![gates over training]({figure})"]
    return lines


def run_gates(run_dirs: Sequence[str | Path], out: str | Path, labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Read every run's gates, write gates.md/.json/.png to OUT. Raises NoGatesError when no run has gates;
    runs without them are listed in the outputs with the reason."""
    from t2mlr.analysis.figures import plot_gates

    if not run_dirs:
        raise ValueError("name at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels gives {len(labels)} names for {len(run_dirs)} runs")
    trajectories, skipped = [], []
    for index, run_dir in enumerate(run_dirs):
        trajectory = gate_trajectory(run_dir)
        if trajectory is None:
            skipped.append(f"{run_dir}: its metrics.jsonl has no gamma_cur/gamma_rec pair: a plain Transformer, "
                           "another baseline, or a T²MLR fusion variant other than the paper's (only fusion=gated has "
                           "both gates); left out")
            continue
        if labels is not None:
            trajectory.run = labels[index]
        trajectories.append(trajectory)
    if not trajectories:
        raise NoGatesError("no run has fusion gates to plot:\n" + "\n".join(skipped))
    out = Path(out)
    figure = plot_gates({t.run: (t.steps, t.gamma_cur, t.gamma_rec) for t in trajectories}, out / FIGURE)
    payload = {"runs": [{**asdict(t), "final_gamma_cur": t.final[0], "final_gamma_rec": t.final[1],
                         "matches_paper": t.matches_paper()} for t in trajectories],
               "skipped": skipped}
    md, js = write_result(out, STEM, _markdown(trajectories, skipped, figure.name), payload)
    return {"markdown": md, "json": js, "figure": figure, **payload}
