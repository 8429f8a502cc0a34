"""Several finetune runs (tasks × seeds) in one report: a table per task with every seed and the spread,
and the paper's figure layout (one bar group per task, one bar per arm, seeds as dots).

Each run's results.md, results.json and predictions.jsonl are copied to OUT/<task>_seed<k>/ so the report
directory is self-contained and every number in it can be recomputed from the predictions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from t2mlr.analysis.finetune_plots import plot_pass_at_1
from t2mlr.experiments.finetune import FIGURE, PREDICTIONS, RESULTS_JSON, RESULTS_MD

__all__ = ["write_summary"]


def _load(run: Path) -> dict[str, Any]:
    path = run / RESULTS_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{run} has no {RESULTS_JSON}: not a finished `t2mlr experiment finetune` run")
    return json.loads(path.read_text(encoding="utf-8"))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _task_table(runs: list[dict[str, Any]]) -> list[str]:
    seeds = [r["preset"]["seed"] for r in runs]
    arms = list(dict.fromkeys(a["label"] for r in runs for a in r["results"]))
    lines = ["| arm | " + " | ".join(f"seed {s} pass@1 (95% interval)" for s in seeds) + " | mean | seed spread |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    for arm in arms:
        cells, values = [], []
        for run in runs:
            found = next((a for a in run["results"] if a["label"] == arm), None)
            if found is None:
                cells.append("–")
                continue
            values.append(found["pass_at_1"])
            lo, hi = found["interval"]
            cells.append(f"{_pct(found['pass_at_1'])} ({_pct(lo)}–{_pct(hi)})")
        mean = sum(values) / len(values)
        spread = f"{_pct(min(values))}–{_pct(max(values))}" if len(values) > 1 else "–"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_pct(mean)} | {spread} |")
    return lines


def write_summary(runs: list[Path], out: Path) -> dict[str, list[dict[str, Any]]]:
    """Write OUT/results.md, OUT/results.json, OUT/pass_at_1.png and the runs' files; return runs by task."""
    loaded = [(run, _load(run)) for run in runs]
    by_key: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for _, payload in loaded:  # grouped by task (and GSM variant); the first run's label names the group
        by_key.setdefault((payload["task"], payload.get("variant")), []).append(payload)
    by_task = {runs[0]["label"]: runs for runs in by_key.values()}
    out.mkdir(parents=True, exist_ok=True)
    for run, payload in loaded:
        target = out / f"{payload['task']}_seed{payload['preset']['seed']}"
        if target.resolve() == run.resolve():  # the run's report already sits where the summary keeps it
            continue
        target.mkdir(exist_ok=True)
        for name in (RESULTS_MD, RESULTS_JSON, PREDICTIONS, FIGURE):
            shutil.copyfile(run / name, target / name)
    lines = ["# Reasoning finetunes: summary", ""]
    for label, task_runs in by_task.items():
        first = task_runs[0]
        lines += [f"## {label}", "",
                  f"Preset `{first['preset']['name']}`, {first['data_facts']['eval_records']} held-out problems per "
                  f"seed, {first['preset']['steps']:,} training steps per arm; per-seed reports in "
                  + ", ".join(f"`{first['task']}_seed{r['preset']['seed']}/`" for r in task_runs) + ".", "",
                  *_task_table(task_runs), ""]
    lines += [f"![pass@1]({FIGURE})", ""]
    (out / RESULTS_MD).write_text("\n".join(lines), encoding="utf-8")
    summary = {label: [{"seed": r["preset"]["seed"], "results": r["results"]} for r in task_runs]
               for label, task_runs in by_task.items()}
    (out / RESULTS_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    bars = {label: {} for label in by_task}
    for label, task_runs in by_task.items():
        for run in task_runs:
            for arm in run["results"]:
                bars[label].setdefault(arm["label"], []).append((arm["pass_at_1"], *arm["interval"]))
    plot_pass_at_1(bars, out / FIGURE, title="Reasoning finetunes: pass@1, 95% intervals, dots = seeds")
    return by_task
