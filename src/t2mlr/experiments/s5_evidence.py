"""The S5-Retrieval evidence study: the paper's training method and analyses where recurrence matters.

`t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence --report results/s5_evidence`
trains every arm of the study for every seed, evaluates each, runs the paper's analyses on the trained
T²MLR models with the existing `t2mlr.analysis` code, and writes one report (`t2mlr.experiments.s5_report`).

The arms are fixed here, before any result (issue #35):

* on `cpu` (2 blocks, T²MLR(1,2)): T²MLR trained on the preset's exact path, T²MLR trained with Jacobi
  (16, 4) (the paper's setting) and with Jacobi (4, 2) (a cheaper one), the parameter-matched Transformer
  for the preset's steps and for T²MLR's measured training compute, full looping ×2, pause tokens ×2, and
  looping T²MLR's block range ×3 — on this backbone T²MLR(1,2) spans every block, so that arm is full
  looping ×3;
* on `cpu-deep` (the same width at 4 blocks, T²MLR(2,3) exact): T²MLR, looping its range ×3
  (`looped:2-3:3`, which differs from full looping here) and the matched Transformer. Its setting was
  decided from cost measurements alone (`t2mlr.experiments.s5_costs`; see `S5Preset` `cpu-deep`).

Layout under OUT: `costs/<preset>.json` (the side-by-side cost measurement of every arm, made once before
any training), `seed_<s>/<preset>/` (an ordinary `s5-retrieval` output: data, one run directory per arm,
results.md/.json, the accuracy figure) and `seed_<s>/analyses/` (gates, gradient fidelity, Jacobi depths).

Resumable: every run checkpoints as it trains and the study always resumes, so running the same command
again continues an interrupted study; finished runs are not retrained (they are only re-evaluated).
Every run trains on the preset's fixed torch threads (1), so the numbers do not depend on the schedule or
on the machine's load. A run that stops on a non-finite loss is recorded as failed and the study goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from t2mlr.experiments.concurrent_runs import (
    RunJob,
    resolve_workers,
    train_runs_keep_going,
)
from t2mlr.experiments.s5_presets import S5Preset, get_preset
from t2mlr.experiments.s5_retrieval import (
    ExperimentPlan,
    arm_spec,
    finish_experiment,
    plan_experiment,
    steps_of,
)
from t2mlr.utils import resolve_device

__all__ = ["DESIGNS", "StudyRun", "Variant", "is_t2mlr_arm", "plan_study", "run_study"]

# The arms of the study, fixed before any result. T²MLR(1,2) is the `cpu` (and `tiny`) preset's placement.
MAIN_ARMS = (
    "t2mlr",  # the preset's path: exact
    "t2mlr:1-2:jacobi:16:4",
    "t2mlr:1-2:jacobi:4:2",
    "transformer",
    "transformer:compute-matched",
    "looped:full:2",
    "pause:2",
    "looped:full:3",  # looped ×3 over T²MLR's block range (1-2), which on 2 blocks is every block
)
DEEP_ARMS = ("t2mlr", "looped:2-3:3", "transformer")  # T²MLR(2,3) exact on 4 blocks


@dataclass(frozen=True)
class Variant:
    """One backbone of the study: a preset and the arms trained on it."""

    preset: str
    arms: tuple[str, ...]


DESIGNS: dict[str, tuple[Variant, ...]] = {
    "cpu": (Variant("cpu", MAIN_ARMS), Variant("cpu-deep", DEEP_ARMS)),
    "tiny": (Variant("tiny", MAIN_ARMS), Variant("tiny-deep", DEEP_ARMS)),  # a pipeline check: numbers mean nothing
}
COSTS_DIR = "costs"


def is_t2mlr_arm(name: str) -> bool:
    spec = arm_spec(name)
    return name == "t2mlr" if spec is None else spec.kind == "t2mlr"


@dataclass
class StudyRun:
    """One seed of one variant: an experiment directory and its plan."""

    seed: int
    variant: Variant
    plan: ExperimentPlan

    @property
    def key(self) -> str:
        return f"seed {self.seed}, {self.variant.preset}"


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed_{seed}"


def study_preset(name: str, seed: int, steps: int | None = None, checkpoint_every: int | None = None) -> S5Preset:
    """A variant's preset for one seed (`steps`, `checkpoint_every`: test overrides)."""
    preset = replace(get_preset(name), seed=seed)
    if steps is not None:
        preset = preset.with_steps(**{arm: steps for arm in preset.steps})
    if checkpoint_every is not None:
        preset = replace(preset, checkpoint_every=checkpoint_every)
    return preset


def plan_study(design: str, seeds: Sequence[int], out: str | Path, device: str = "cpu", steps: int | None = None,
               checkpoint_every: int | None = None) -> list[StudyRun]:
    """Every (seed, variant) experiment of the study, planned (data written, configs built); every periodic
    checkpoint of the T²MLR arms is kept, for the mid-training analyses."""
    if design not in DESIGNS:
        raise ValueError(f"the evidence study has no design for preset {design!r}; choose from {', '.join(DESIGNS)}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"name at least one seed, each once; got {list(seeds)}")
    out = Path(out)
    runs = []
    for seed in seeds:
        for variant in DESIGNS[design]:
            preset = study_preset(variant.preset, seed, steps, checkpoint_every)
            keep = tuple(arm for arm in variant.arms if is_t2mlr_arm(arm))
            plan = plan_experiment(preset, seed_dir(out, seed) / variant.preset, device, variant.arms, resume=True,
                                   keep_all_checkpoints=keep)
            runs.append(StudyRun(seed, variant, plan))
    return runs


def _cost_ratio(costs: dict[str, Any] | None, name: str) -> float:
    if costs is None:
        return 1.0
    ratios = {entry["name"]: entry["median_ratio"] for entry in costs["training"]}
    if name in ratios:
        return float(ratios[name])
    spec = arm_spec(name)
    if spec is not None and spec.budget is not None:  # the same model as the matched Transformer
        return float(ratios.get("transformer", 1.0))
    return 1.0


def ordered_jobs(runs: Sequence[StudyRun], costs: dict[str, dict[str, Any]]) -> list[RunJob]:
    """Every run's job, seed by seed (a seed's results complete early), and within a seed the dearest
    first (measured step ratio × steps), so that two workers finish a seed close together."""
    jobs = []
    for seed in dict.fromkeys(run.seed for run in runs):
        seed_jobs = []
        for run in (r for r in runs if r.seed == seed):
            preset, variant_costs = run.plan.preset, costs.get(run.variant.preset)
            for job, name in zip(run.plan.jobs(prefix=f"s{seed}/{preset.name}/"), run.plan.models):
                seed_jobs.append((_cost_ratio(variant_costs, name) * steps_of(preset, name), job))
        jobs.extend(job for _, job in sorted(seed_jobs, key=lambda pair: -pair[0]))
    return jobs


def load_or_measure_costs(design: str, out: Path, rounds: int, decode_rounds: int) -> dict[str, dict[str, Any]]:
    """The side-by-side cost measurement of every variant's arms (`t2mlr.experiments.s5_costs`), made once and
    kept under OUT/costs/ (a resumed study reuses it)."""
    from t2mlr.experiments.s5_costs import measure_costs

    costs = {}
    for variant in DESIGNS[design]:
        path = out / COSTS_DIR / f"{variant.preset}.json"
        if not path.is_file():
            tqdm.write(f"[s5-evidence] measuring the arms' costs on {variant.preset} → {path}")
            measured = measure_costs(get_preset(variant.preset), list(variant.arms), rounds=rounds,
                                     decode_rounds=decode_rounds)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
        costs[variant.preset] = json.loads(path.read_text(encoding="utf-8"))
    return costs


def run_study(design: str, seeds: Sequence[int], out: str | Path, report: str | Path | None = None,
              device: str = "cpu", workers: int | None = None, analyses: bool = True, steps: int | None = None,
              checkpoint_every: int | None = None, cost_rounds: int = 21, decode_rounds: int = 11) -> dict[str, Any]:
    """Measure the arms' costs (once), train every run (resuming), evaluate each seed, run the analyses and
    write the report (default OUT/report). Returns what the report holds."""
    started = time.perf_counter()
    out = Path(out)
    runs = plan_study(design, seeds, out, device, steps, checkpoint_every)
    costs = load_or_measure_costs(design, out, cost_rounds, decode_rounds)
    jobs = ordered_jobs(runs, costs)
    workers = resolve_workers(workers, len(jobs), resolve_device(device))
    tqdm.write(f"[s5-evidence] {len(jobs)} runs ({len(seeds)} seeds) → {out}, {workers} at a time")
    trained, failed = train_runs_keep_going(jobs, resume=True, workers=workers)
    for run in runs:
        prefix = f"s{run.seed}/{run.plan.preset.name}/"
        finish_experiment(run.plan, {name: trained[prefix + name] for name in run.plan.models if prefix + name in trained},
                          started, workers, {name: failed[prefix + name] for name in run.plan.models
                                             if prefix + name in failed})
    if not analyses:
        return {"runs": [run.key for run in runs], "failed": failed}
    from t2mlr.experiments.s5_report import analyze_and_report

    return analyze_and_report(runs, out, Path(report) if report is not None else out / "report", costs, failed)
