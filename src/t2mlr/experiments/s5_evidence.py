"""The S5-Retrieval evidence study: the paper's training method and analyses where recurrence matters.

`t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence --report results/s5_evidence`
trains every arm of the study for every seed, evaluates each, runs the paper's analyses on the trained
T²MLR models with the existing `t2mlr.analysis` code, and writes one report (below).

The arms are fixed here, before any result (issue #35):

* on `cpu` (2 blocks, T²MLR(1,2)): T²MLR trained on the preset's exact path, T²MLR trained with Jacobi
  (16, 4) (the paper's setting) and with Jacobi (4, 2) (a cheaper one), the parameter-matched Transformer
  for the preset's steps and for T²MLR's measured training compute, full looping ×2, pause tokens ×2, and
  looping T²MLR's block range ×3 — on this backbone T²MLR(1,2) spans every block, so that arm is full
  looping ×3;
* on `cpu-deep` (the same width at 4 blocks, T²MLR(2,3) exact): T²MLR, looping its range ×3
  (`looped:2-3:3`, which differs from full looping here) and the matched Transformer. Its setting was
  decided from cost measurements alone (`t2mlr.analysis.costs`; see configs/experiments/s5_cpu_deep.yaml).

Layout under OUT: `costs/<preset>.json` (the side-by-side cost measurement of every arm, made once before
any training), `seed_<s>/<preset>/` (an ordinary `s5-retrieval` output: data, one run directory per arm,
results.md/.json, the accuracy figure) and `seed_<s>/analyses/` (gates, gradient fidelity, Jacobi depths).

Resumable: every run checkpoints as it trains and the study always resumes, so running the same command
again continues an interrupted study; finished runs are not retrained (they are only re-evaluated).
Every run trains on the preset's fixed torch threads (1), so the numbers do not depend on the schedule or
on the machine's load. A run that stops on a non-finite loss is recorded as failed and the study goes on.

Analyses, per seed, on the trained T²MLR models, with the project's own analysis code:

* gates (`t2mlr.analysis.gates`): γ_cur and γ_rec against step from every T²MLR run's metrics.jsonl;
* gradient fidelity (`t2mlr.analysis.gradient_fidelity`) of the `cpu` T²MLR arms on a training batch (64
  rows of the model's own training stream), over the paper's (d_forward, d_backward) grid against the
  paper's (32, 32) anchor, on the mid-training checkpoint and the final one; and, on the final one, against
  the exact gradient (an anchor deeper than the longest row, where the Jacobi gradient is the exact path's
  untruncated gradient), since 32 iterations do not reach the end of a 70-token row;
* Jacobi depths (`t2mlr.analysis.jacobi_vs_exact.run_jacobi_depths`) of every trained T²MLR model: on 64
  training rows, the Jacobi path at d_forward 2 … 32 against the exact path (loss, logits, argmax, how far
  the cache state is from its fixed point); and the held-out S5 evaluation itself on each of those paths
  and with the recurrence off (R never fused: the ablation that shows whether the model uses its state).

An analysis whose output exists is not run again (the study resumes).

The report (`--report`, the repository's is results/s5_evidence/): every seed's raw numbers copied as they
were written (`seeds/seed_S/PRESET/results.json` and the analyses' .json/.md/.png), `summary.json` and
`README.md` with the mean and spread (min–max, sample standard deviation) per arm computed from those
per-seed files, the cost measurement, and the figures: EM vs N per arm (mean over seeds, min–max band),
gates vs step, cosine vs (d_forward, d_backward), EM by evaluation path.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from t2mlr.analysis.common import TRAINING_DATA, load_analysis_model
from t2mlr.analysis.costs import measure_costs
from t2mlr.analysis.depth_grid import DEFAULT_DEPTHS
from t2mlr.analysis.figures import plot_accuracy_by_depth, plot_accuracy_over_seeds, plot_cosine_grid, plot_gates
from t2mlr.analysis.gates import gate_trajectory, run_gates
from t2mlr.analysis.gradient_fidelity import parse_depths, run_gradient_fidelity
from t2mlr.analysis.jacobi_vs_exact import run_jacobi_depths
from t2mlr.analysis.report import table, write_result
from t2mlr.experiments import s5
from t2mlr.experiments.s5 import (
    FIGURE,
    RESULTS_JSON,
    RESULTS_MD,
    S5Plan,
    arm_spec,
    evaluate_by_n,
    is_t2mlr_arm,
    label_of,
    run_dir_name,
)
from t2mlr.experiments.sections import DESIGNS, Variant, preset_config
from t2mlr.training.arms import Arm, fixed_threads, resolve_workers, train_arms
from t2mlr.training.config import load_sections
from t2mlr.training.metrics import METRICS_FILE, optimizer_step_seconds, read_metrics
from t2mlr.training.trainer import CHECKPOINT_DIR, FINAL_DIR

__all__ = ["DESIGNS", "RunPlace", "StudyRun", "Variant", "dry_run_arms", "is_t2mlr_arm", "plan_study", "rewrite_report",
           "run_study", "summarize_arm", "summary_rows"]

COSTS_DIR = "costs"
TRAIN_TIMES = "train_time.json"  # per seed and preset: arm -> optimizer-step seconds


@dataclass(frozen=True)
class RunPlace:
    """Where one seed of one variant lives and which arms it has: all that the report reads."""

    seed: int
    preset: str
    out: Path
    models: tuple[str, ...]

    @property
    def t2mlr_arms(self) -> list[str]:
        return [arm for arm in self.models if is_t2mlr_arm(arm)]


@dataclass
class StudyRun:
    """One seed of one variant: an experiment directory and its plan."""

    seed: int
    variant: Variant
    plan: S5Plan

    @property
    def key(self) -> str:
        return f"seed {self.seed}, {self.variant.preset}"

    @property
    def place(self) -> RunPlace:
        return RunPlace(self.seed, self.plan.preset, self.plan.out, self.plan.models)


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed_{seed}"


def costs_file(out: Path, preset: str) -> Path:
    """The side-by-side cost measurement of one variant's arms, made once per study."""
    return out / COSTS_DIR / f"{preset}.json"


def check_design(design: str, seeds: Sequence[int] | None = None) -> None:
    """Refuse a preset the study has no design for, and no seed or a seed named twice."""
    if design not in DESIGNS:
        raise ValueError(f"the evidence study has no design for preset {design!r}; choose from {', '.join(DESIGNS)}")
    if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
        raise ValueError(f"name at least one seed, each once; got {list(seeds)}")


def variant_configs(design: str, seeds: Sequence[int], overrides: Sequence[str]
                    ) -> Iterator[tuple[int, Variant, dict[str, Any], s5.S5Task, tuple[str, ...]]]:
    """Each (seed, variant) of the study with its trainer tree and task section (`overrides`: dotted config
    overrides for every variant, e.g. the tests' steps), and its T²MLR arms, whose every periodic checkpoint is
    kept for the mid-training analyses."""
    check_design(design, seeds)
    for seed in seeds:
        for variant in DESIGNS[design]:
            tree, sections = load_sections(preset_config("s5", variant.preset), [*overrides, f"train.seed={seed}"],
                                           {"task": s5.S5Task})
            yield seed, variant, tree, sections["task"], tuple(arm for arm in variant.arms if is_t2mlr_arm(arm))


def study_arm(arm: Arm, seed: int, preset: str, name: str, where: Path) -> Arm:
    """A run's arm as the study trains it: named `s<seed>/<preset>/<arm>`, in its seed's directory `where`."""
    return replace(arm, name=f"s{seed}/{preset}/{name}", directory=str(where / arm.dir_name))


def plan_study(design: str, seeds: Sequence[int], out: str | Path, overrides: Sequence[str] = ()) -> list[StudyRun]:
    """Every (seed, variant) experiment of the study, planned (data written, arms built; see `variant_configs`)."""
    return [StudyRun(seed, variant, s5.plan(variant.preset, task, tree, seed_dir(Path(out), seed) / variant.preset,
                                            variant.arms, resume=True, keep_all_checkpoints=keep))
            for seed, variant, tree, task, keep in variant_configs(design, seeds, overrides)]


def dry_run_arms(design: str, seeds: Sequence[int], out: str | Path, overrides: Sequence[str] = ()
                 ) -> tuple[list[Arm], list[str]]:
    """Every run of the study as `plan_study` builds it (named as `ordered_arms` names them), without writing
    anything (`--dry-run`)."""
    arms, notes = [], ["the study also measures every arm's training and decoding cost and runs its analyses on the "
                       "CPU: not sized here"]
    for seed, variant, tree, task, keep in variant_configs(design, seeds, overrides):
        where = Path(f"seed_{seed}") / variant.preset
        built, data_notes = s5.dry_run_arms(task, tree, Path(out) / where, variant.arms, keep)
        arms += [study_arm(arm, seed, variant.preset, name, where) for name, arm in built.items()]
        notes += [note for note in data_notes if note not in notes]
    return arms, notes


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


def ordered_arms(runs: Sequence[StudyRun], costs: dict[str, dict[str, Any]]) -> list[Arm]:
    """Every run's arm (`study_arm`), seed by seed (a seed's results complete early), and within a seed the
    dearest first (measured step ratio × steps), so that two workers finish a seed close together."""
    arms = []
    for seed in dict.fromkeys(run.seed for run in runs):
        seed_arms = []
        for run in (r for r in runs if r.seed == seed):
            where = run.plan.out.relative_to(run.plan.out.parent.parent)
            for name, arm in run.plan.arms.items():
                cost = _cost_ratio(costs.get(run.variant.preset), name) * run.plan.steps(name)
                seed_arms.append((cost, study_arm(arm, seed, run.plan.preset, name, where)))
        arms.extend(arm for _, arm in sorted(seed_arms, key=lambda pair: -pair[0]))
    return arms


def load_or_measure_costs(runs: Sequence[StudyRun], out: Path, rounds: int, decode_rounds: int
                          ) -> dict[str, dict[str, Any]]:
    """The side-by-side cost measurement of every variant's arms (`t2mlr.analysis.costs`, on the first seed's
    arms), made once and kept under OUT/costs/ (a resumed study reuses it)."""

    costs = {}
    for run in runs:
        path = costs_file(out, run.variant.preset)
        if run.variant.preset in costs:
            continue
        if not path.is_file():
            tqdm.write(f"[s5-evidence] measuring the arms' costs on {run.variant.preset} → {path}")
            measured = measure_costs(list(run.plan.arms.values()), rounds=rounds, decode_rounds=decode_rounds)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"preset": run.variant.preset, **measured}, indent=2) + "\n", encoding="utf-8")
        costs[run.variant.preset] = json.loads(path.read_text(encoding="utf-8"))
    return costs


def run_study(design: str, seeds: Sequence[int], out: str | Path, report: str | Path | None = None,
              workers: int | None = None, analyses: bool = True, overrides: Sequence[str] = (), cost_rounds: int = 21,
              decode_rounds: int = 11, report_only: bool = False) -> dict[str, Any]:
    """Measure the arms' costs (once), train every run (resuming), evaluate each seed, run the analyses and
    write the report (default OUT/report). Returns what the report holds. `report_only`: write the report
    from what OUT holds (see `rewrite_report`)."""

    started = time.perf_counter()
    out = Path(out)
    report = Path(report) if report is not None else out / "report"
    if report_only:
        return rewrite_report(design, seeds, out, report)
    runs = plan_study(design, seeds, out, overrides)
    costs = load_or_measure_costs(runs, out, cost_rounds, decode_rounds)
    arms = ordered_arms(runs, costs)
    workers = resolve_workers(workers, len(arms), runs[0].plan.tree["train"].get("device", "auto"))
    tqdm.write(f"[s5-evidence] {len(arms)} runs ({len(seeds)} seeds) → {out}, {workers} at a time")
    trained, failed = train_arms(arms, out, resume=True, workers=workers, keep_going=True)
    for run in runs:
        prefix = f"s{run.seed}/{run.plan.preset}/"
        s5.finish(run.plan, {name: trained[prefix + name] for name in run.plan.models if prefix + name in trained},
                  started, workers, {name: failed[prefix + name] for name in run.plan.models if prefix + name in failed})
    if not analyses:
        return {"runs": [run.key for run in runs], "failed": failed}
    run_analyses(runs, out)
    return write_report([run.place for run in runs], out, report, costs, failed)


def rewrite_report(design: str, seeds: Sequence[int], out: Path, report: Path) -> dict[str, Any]:
    """The report again from every seed's results, the analyses and the cost measurement under `out`, as they
    are: nothing under `out` is written, trained, evaluated or measured (e.g. after a change to the report
    itself). Refused when a seed's results or a cost measurement is missing."""
    check_design(design)
    places = [RunPlace(seed, variant.preset, seed_dir(out, seed) / variant.preset, variant.arms)
              for seed in seeds for variant in DESIGNS[design]]
    needed = [place.out / RESULTS_JSON for place in places] + [costs_file(out, v.preset) for v in DESIGNS[design]]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        raise ValueError(f"--report-only writes the report from a finished study; missing: {', '.join(missing)} "
                         "(run the study without --report-only first)")
    failed = {f"s{place.seed}/{place.preset}/{name}": message for place in places
              for name, message in json.loads((place.out / RESULTS_JSON).read_text()).get("failed", {}).items()}
    costs = {variant.preset: json.loads(costs_file(out, variant.preset).read_text(encoding="utf-8"))
             for variant in DESIGNS[design]}
    return write_report(places, out, report, costs, failed)


# ---------------------------------------------------------------------------------------------- analyses

ANALYSES = "analyses"
PAPER_ANCHOR = (32, 32)
EVAL_DEPTHS = (2, 4, 8, 16, 32)
# The held-out evaluation of every trained T²MLR model on each Jacobi depth, and with R never fused (the
# recurrence ablation: what the model does without the state it learned to use).
EVAL_PATHS: dict[str, dict[str, Any]] = {
    **{f"jacobi_{d}": {"recurrence": "jacobi", "d_forward": d, "d_backward": 1} for d in EVAL_DEPTHS},
    "off": {"recurrence": "off"},
}
# Per gradient-fidelity anchor: the figure's name, the anchor as its title names it, the README's heading, alt text
FIDELITY_PANELS = {
    "paper": ("gradient_fidelity", f"the ({PAPER_ANCHOR[0]}, {PAPER_ANCHOR[1]}) anchor",
              "Anchor (32, 32), the paper's:", "cosine vs depth"),
    "exact": ("gradient_fidelity_exact_anchor", "the exact (deeper than every row)",
              "Anchor deeper than the longest row (the exact gradient), final checkpoints:",
              "cosine vs depth, exact anchor"),
}
FIDELITY_ROWS = 64  # one training batch of the cpu preset
JACOBI_GAP_POINTS = 3.0  # issue #35: Jacobi (16, 4) within 3 points of exact training on the training lengths


def _finished_t2mlr_arms(run: StudyRun) -> Iterator[tuple[str, Path]]:
    """Each T²MLR arm of the run that finished training, with its run directory."""
    for arm in run.place.t2mlr_arms:
        run_dir = run.plan.out / run_dir_name(arm)
        if (run_dir / FINAL_DIR / "config.json").is_file():
            yield arm, run_dir


def mid_checkpoint(run_dir: Path, max_steps: int) -> Path | None:
    """The kept checkpoint at the largest step <= half the run's steps (None when there is none)."""
    steps = [(int(path.name.split("_")[-1]), path) for path in (run_dir / CHECKPOINT_DIR).glob("step_*")]
    first_half = [(step, path) for step, path in steps if 0 < step <= max_steps // 2]
    return max(first_half)[1] if first_half else None


def _gates(runs: Sequence[StudyRun], out: Path, seed: int) -> None:
    # run directory -> label, of every T²MLR run that has trained
    labels = {run.plan.out / run_dir_name(arm): f"{run.plan.preset}: {label_of(arm)}" for run in runs
              for arm in run.place.t2mlr_arms if (run.plan.out / run_dir_name(arm) / "metrics.jsonl").is_file()}
    if labels:
        run_gates(list(labels), seed_dir(out, seed) / ANALYSES / "gates", list(labels.values()))


def _gradient_fidelity(run: StudyRun, out: Path) -> None:
    deepest = run.plan.task.max_length() + 1  # > every row: the Jacobi gradient is the exact one there
    for arm, run_dir in _finished_t2mlr_arms(run):
        mid = mid_checkpoint(run_dir, run.plan.steps(arm))
        checkpoints = {"final": (run_dir / FINAL_DIR, [PAPER_ANCHOR, (deepest, deepest)])}
        if mid is not None:
            checkpoints = {"mid": (mid, [PAPER_ANCHOR]), **checkpoints}
        for when, (checkpoint, anchors) in checkpoints.items():
            for anchor in anchors:
                target = seed_dir(out, run.seed) / ANALYSES / "gradient_fidelity" / f"{run_dir.name}_{when}_{anchor[0]}"
                if (target / "gradient_fidelity.json").is_file():
                    continue
                tqdm.write(f"[s5-evidence] gradient fidelity: seed {run.seed}, {arm}, {when} ({checkpoint.name}), "
                           f"anchor {anchor}")
                run_gradient_fidelity(checkpoint, TRAINING_DATA, target, depths=parse_depths(DEFAULT_DEPTHS),
                                      anchor=anchor, batch_size=FIDELITY_ROWS, seed=0, device="cpu")


def _jacobi_depths(run: StudyRun, out: Path) -> None:
    for arm, run_dir in _finished_t2mlr_arms(run):
        final = run_dir / FINAL_DIR
        target = seed_dir(out, run.seed) / ANALYSES / "jacobi_depths" / f"{run.plan.preset}_{run_dir.name}"
        if not (target / "jacobi_depths.json").is_file():
            run_jacobi_depths(final, TRAINING_DATA, target, depths=EVAL_DEPTHS, rows=FIDELITY_ROWS, device="cpu")
        em_file = target / "s5_eval_by_path.json"
        by_path = json.loads(em_file.read_text(encoding="utf-8"))["paths"] if em_file.is_file() else {}
        missing = [name for name in EVAL_PATHS if name not in by_path]  # an older study's file gains the new paths
        if not missing:
            continue
        model = load_analysis_model(final, device="cpu")
        for name in missing:
            per_n = evaluate_by_n(model, run.plan.eval_samples, run.plan.tokenizer, run.plan.arms[arm].config.eval.batch_size,
                                  "cpu", desc=f"eval {arm} {name}", path=EVAL_PATHS[name])
            by_path[name] = {str(n): vars(m) for n, m in per_n.items()}
        em_file.write_text(json.dumps({"model_dir": str(final), "paths": by_path}, indent=2) + "\n", encoding="utf-8")


def run_analyses(runs: Sequence[StudyRun], out: Path) -> None:
    """Every analysis of every seed (each on the seed's preset's torch threads; existing outputs are kept)."""
    for seed in dict.fromkeys(run.seed for run in runs):
        seed_runs = [run for run in runs if run.seed == seed]
        with fixed_threads(seed_runs[0].plan.task.torch_threads):
            _gates(seed_runs, out, seed)
            _gradient_fidelity(seed_runs[0], out)  # the main variant (the design lists it first)
            for run in seed_runs:
                _jacobi_depths(run, out)


# ---------------------------------------------------------------------------------------------- summary


def _mean_over(per_n: Mapping[str, Mapping[str, float]], key: str, lo: int, hi: int) -> float | None:
    values = [m[key] for n, m in per_n.items() if lo <= int(n) <= hi]
    return sum(values) / len(values) if values else None


def summarize_arm(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, min, max and sample standard deviation (None with one value) of one number over seeds."""
    if not values:
        return {"seeds": 0, "mean": None, "min": None, "max": None, "std": None}
    return {"seeds": len(values), "mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else None}


METRICS = (  # summary key, per-N metric, range ("train" or "beyond")
    ("em_train", "exact_match", "train"),
    ("token_train", "token_accuracy", "train"),
    ("em_beyond", "exact_match", "beyond"),
    ("token_beyond", "token_accuracy", "beyond"),
)


def _new_row(preset: str, arm: str, model: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An arm's summary row before its seeds: described by a seed's results, or only named (its run failed)."""
    described = ({key: model[key] for key in ("label", "train_path", "eval_path", "parameters", "steps")} if model
                 else {"label": label_of(arm), "train_path": "", "eval_path": "", "parameters": None, "steps": None})
    return {"preset": preset, "arm": arm, **described, "per_seed": {}, "failed_seeds": {}}


def summary_rows(seed_results: Mapping[int, Mapping[str, Any]],
                 train_times: Mapping[int, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """One row per (preset, arm) over the seeds' results.json payloads (seed -> payload), in the order the arms
    were listed: per seed the per-N means over the training lengths and beyond, then their spread; and the
    training time (`train_times`, seed -> arm -> optimizer-step seconds, else results.json's own train_seconds)
    with its ratio to the exact-trained T²MLR of the same seed."""
    train_times = train_times or {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for seed, payload in sorted(seed_results.items()):
        preset = payload["preset"]
        lo, hi = preset["train_n"]
        ranges = {"train": (lo, hi), "beyond": (hi + 1, preset["eval_n"][1])}
        for model in payload["models"]:
            row = rows.setdefault((preset["name"], model["name"]), _new_row(preset["name"], model["name"], model))
            row["per_seed"][seed] = {key: _mean_over(model["per_n"], metric, *ranges[which])
                                     for key, metric, which in METRICS}
            row["per_seed"][seed]["train_seconds"] = train_times.get(seed, {}).get(model["name"], model["train_seconds"])
        for name, message in payload.get("failed", {}).items():
            row = rows.setdefault((preset["name"], name), _new_row(preset["name"], name))
            row["failed_seeds"][seed] = message
    for row in rows.values():
        for key, _, _ in METRICS:
            values = [s[key] for s in row["per_seed"].values() if s[key] is not None]
            row[key] = summarize_arm(values)
        exact = rows.get((row["preset"], "t2mlr"), {"per_seed": {}})["per_seed"]
        for seed, numbers in row["per_seed"].items():
            reference = exact.get(seed, {}).get("train_seconds")
            numbers["train_time_ratio"] = numbers["train_seconds"] / reference if reference else None
        row["train_seconds"] = summarize_arm([s["train_seconds"] for s in row["per_seed"].values()])
        row["train_time_ratio"] = summarize_arm([s["train_time_ratio"] for s in row["per_seed"].values()
                                                 if s["train_time_ratio"] is not None])
    return list(rows.values())


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _spread(stats: Mapping[str, Any]) -> str:
    if stats["mean"] is None:
        return "–"
    if stats["seeds"] == 1:
        return f"{_pct(stats['mean'])}"
    return f"{_pct(stats['mean'])} ({_pct(stats['min'])}–{_pct(stats['max'])})"


def _training_time(row: Mapping[str, Any]) -> list[str]:
    """Mean training minutes and mean ratio to the exact-trained T²MLR, as two table cells."""
    seconds, ratio = row["train_seconds"]["mean"], row["train_time_ratio"]["mean"]
    return ["–" if seconds is None else f"{seconds / 60:.1f}", "–" if ratio is None else f"{ratio:.2f}×"]


def summary_table(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> list[str]:
    head = ["preset", "arm", "trained on", "steps", "EM train N, mean (min–max)", "EM beyond, mean (min–max)",
            "token acc train", "token acc beyond", "training min", "× exact T²MLR's",
            *[f"EM train, seed {s}" for s in seeds]]
    cells = []
    for row in rows:
        per_seed = [(_pct(row["per_seed"][s]["em_train"]) if s in row["per_seed"] else
                     ("failed" if s in row["failed_seeds"] else "–")) for s in seeds]
        steps = "–" if row["steps"] is None else f"{row['steps']:,}"
        cells.append([row["preset"], row["label"], row["train_path"], steps, _spread(row["em_train"]),
                      _spread(row["em_beyond"]), _spread(row["token_train"]), _spread(row["token_beyond"]),
                      *_training_time(row), *per_seed])
    return table(head, cells, "llll" + "r" * (len(head) - 4))


# ---------------------------------------------------------------------------------------------- report


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _write_train_times(place: RunPlace, path: Path) -> None:
    """Each arm's optimizer-step seconds, read from its metrics.jsonl: the wall clock a run records stops
    counting when the study is interrupted between an arm's end and its seed's results, the step records
    do not."""
    run_dirs = {arm: place.out / run_dir_name(arm) for arm in place.models}
    seconds = {arm: optimizer_step_seconds(read_metrics(run_dir)) for arm, run_dir in run_dirs.items()
               if (run_dir / METRICS_FILE).is_file()}
    path.write_text(json.dumps(seconds, indent=1) + "\n", encoding="utf-8")


def _copy_seed_files(places: Sequence[RunPlace], out: Path, report: Path) -> None:
    """Copy every seed's results and analyses into the report."""
    for place in places:
        target = report / "seeds" / f"seed_{place.seed}" / place.preset
        for name in (RESULTS_JSON, RESULTS_MD, FIGURE):
            if (place.out / name).is_file():
                _copy(place.out / name, target / name)
        _write_train_times(place, target / TRAIN_TIMES)
    for seed in dict.fromkeys(place.seed for place in places):
        source = seed_dir(out, seed) / ANALYSES
        for path in sorted(source.rglob("*")) if source.is_dir() else []:
            if path.is_file() and path.suffix in (".json", ".md", ".png"):
                _copy(path, report / "seeds" / f"seed_{seed}" / ANALYSES / path.relative_to(source))


def read_seed_results(report: Path, name: str = RESULTS_JSON) -> dict[str, dict[int, dict[str, Any]]]:
    """preset -> seed -> results.json (or another per-seed file `name`), read back from the report's copies."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted((report / "seeds").glob(f"seed_*/*/{name}")):
        seed = int(path.parent.parent.name.removeprefix("seed_"))
        found.setdefault(path.parent.name, {})[seed] = json.loads(path.read_text(encoding="utf-8"))
    return found


def _curves(results: Mapping[int, Mapping[str, Any]]) -> dict[str, tuple[dict, dict]]:
    arms: dict[str, tuple[dict, dict]] = {}
    for seed, payload in sorted(results.items()):
        for model in payload["models"]:
            label = model["label"] + (f", {model['train_path']} training" if model["name"] == "t2mlr" else "")
            em, tok = arms.setdefault(label, ({}, {}))
            em[seed] = {int(n): m["exact_match"] for n, m in model["per_n"].items()}
            tok[seed] = {int(n): m["token_accuracy"] for n, m in model["per_n"].items()}
    return arms


def _fidelity_panels(report: Path) -> dict[str, dict[str, dict[tuple[int, int], list[float]]]]:
    """Cosines per setting over seeds, by anchor ("paper": (32, 32); "exact": deeper than every row) and by
    model and checkpoint, read from the per-seed gradient_fidelity.json copies."""
    panels: dict[str, dict[str, dict[tuple[int, int], list[float]]]] = {"paper": {}, "exact": {}}
    for path in sorted((report / "seeds").glob(f"seed_*/{ANALYSES}/gradient_fidelity/*/gradient_fidelity.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        arm_dir, when, _ = path.parent.name.rsplit("_", 2)
        anchor = (payload["anchor"]["d_forward"], payload["anchor"]["d_backward"])
        kind = "paper" if anchor == PAPER_ANCHOR else "exact"
        title = f"{arm_dir} ({when} checkpoint)" + ("" if kind == "paper" else f", anchor ({anchor[0]}, {anchor[1]})")
        cells = panels[kind].setdefault(title, {})
        for setting in payload["settings"]:
            cells.setdefault((setting["d_forward"], setting["d_backward"]), []).append(setting["cosine"])
    return {kind: dict(sorted(p.items(), key=lambda item: ("final" in item[0], item[0]))) for kind, p in panels.items()}


def _fidelity_table(panels: Mapping[str, Mapping[tuple[int, int], list[float]]]) -> list[str]:
    if not panels:
        return []
    settings = sorted({cell for cells in panels.values() for cell in cells})
    rows = [[title, *[f"{statistics.fmean(cells[s]):.3f}" if s in cells else "–" for s in settings]]
            for title, cells in panels.items()]
    return table(["model (checkpoint)", *[f"({f},{b})" for f, b in settings]], rows, "l" + "r" * len(settings))


def _depth_summary(report: Path, results: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> tuple[dict, list[str]]:
    """EM on the training lengths per evaluation path (exact from results.json, Jacobi depths from the
    analysis), and the cache's distance from its fixed point at each depth, per T²MLR arm over seeds."""
    em: dict[str, dict[str, list[float]]] = {}
    state: dict[str, dict[int, list[float]]] = {}
    for path in sorted((report / "seeds").glob(f"seed_*/{ANALYSES}/jacobi_depths/*/s5_eval_by_path.json")):
        seed = int(path.parts[-5].removeprefix("seed_"))
        preset, arm_dir = path.parent.name.split("_", 1)
        payload = results[preset][seed]
        lo, hi = payload["preset"]["train_n"]
        model = next(m for m in payload["models"] if run_dir_name(m["name"]) == arm_dir)
        label = f"{preset}: {model['label']}"
        by_path = em.setdefault(label, {})
        by_path.setdefault("exact", []).append(_mean_over(model["per_n"], "exact_match", lo, hi))
        for name, per_n in json.loads(path.read_text(encoding="utf-8"))["paths"].items():
            column = f"J{name.removeprefix('jacobi_')}" if name.startswith("jacobi_") else f"R {name}"
            by_path.setdefault(column, []).append(_mean_over(per_n, "exact_match", lo, hi))
        depths = json.loads((path.parent / "jacobi_depths.json").read_text(encoding="utf-8"))["depths"]
        for row in depths:
            state.setdefault(label, {}).setdefault(row["d_forward"], []).append(row["state_gap"])
    if not em:
        return {}, []
    names = list(next(iter(em.values())))
    rows = []
    for label, by_path in em.items():
        cells = [_pct(statistics.fmean(by_path[n])) if n in by_path else "–" for n in names]
        gaps = " / ".join(f"{max(state[label][d]):.1e}" for d in EVAL_DEPTHS if d in state.get(label, {}))
        rows.append([label, *cells, gaps])
    head = ["T²MLR model", *names, "state distance at d = " + " / ".join(str(d) for d in EVAL_DEPTHS)]
    return {"em_train_by_path": em, "state_gap_max_by_depth": state}, table(head, rows, "l" + "r" * (len(names) + 1))


def _gate_lines(report: Path) -> tuple[list[dict[str, Any]], list[str]]:
    finals = []
    for path in sorted((report / "seeds").glob(f"seed_*/{ANALYSES}/gates/gates.json")):
        seed = int(path.parts[-4].removeprefix("seed_"))
        for run in json.loads(path.read_text(encoding="utf-8"))["runs"]:
            finals.append({"seed": seed, "run": run["run"], "gamma_cur": run["final_gamma_cur"],
                           "gamma_rec": run["final_gamma_rec"]})
    rows = [[f["run"], f["seed"], f"{f['gamma_cur']:+.3f}", f"{f['gamma_rec']:+.3f}", f"{math.tanh(f['gamma_cur']):+.3f}",
             f"{math.tanh(f['gamma_rec']):+.3f}"] for f in finals]
    head = ["T²MLR model", "seed", "final γ_cur", "final γ_rec", "tanh γ_cur", "tanh γ_rec"]
    return finals, table(head, rows, "lrrrrr")


def _gates_figure(places: Sequence[RunPlace], report: Path) -> Path | None:
    curves = {}
    for place in places:
        for arm in place.t2mlr_arms:
            trajectory = gate_trajectory(place.out / run_dir_name(arm))
            if trajectory is not None:
                curves[f"{place.preset} {label_of(arm)}, seed {place.seed}"] = (
                    trajectory.steps, trajectory.gamma_cur, trajectory.gamma_rec)
    return plot_gates(curves, report / "gates.png") if curves else None


def _cost_lines(costs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = []
    for preset, measured in costs.items():
        decoding = {entry["name"]: entry for entry in measured.get("decoding", [])}
        for entry in measured["training"]:
            dec = decoding.get(entry["name"])
            rows.append([preset, entry["label"], f"{entry['median_seconds']:.3f}", f"{entry['median_ratio']:.2f}×",
                         f"{entry['flop_ratio']:.2f}×",
                         *([f"{1000 * dec['median_seconds']:.2f}", f"{dec['median_ratio']:.2f}×",
                            f"{dec['flop_ratio']:.2f}×"] if dec else ["–"] * 3)])
    head = ["preset", "arm", "training step (s)", "× matched Transformer", "FLOP model", "decode (ms/token)",
            "× matched Transformer", "FLOP model"]
    lines = [*table(head, rows, "llrrrrrr"), ""]
    for preset, measured in costs.items():
        ratios = {entry["name"]: entry["median_ratio"] for entry in measured["training"]}
        for name, ratio in ratios.items():
            if "t2mlr" in ratios and ":jacobi:" in name:
                lines.append(f"- {preset}: {label_of(name)} costs {ratio / ratios['t2mlr']:.2f}× T²MLR's exact-path "
                             "training step (the ratio of the two ratios above).")
    return lines


def _jacobi_gap(rows: Sequence[Mapping[str, Any]], preset: str) -> dict[str, Any]:
    """Jacobi-trained minus exact-trained EM on the training lengths, per seed (points), for each Jacobi arm."""
    by_arm = {row["arm"]: row for row in rows if row["preset"] == preset}
    exact = by_arm.get("t2mlr")
    gaps = {}
    for arm, row in by_arm.items():
        if exact is None or not arm.startswith("t2mlr:") or ":jacobi:" not in arm:
            continue
        per_seed = {seed: 100 * (row["per_seed"][seed]["em_train"] - exact["per_seed"][seed]["em_train"])
                    for seed in row["per_seed"] if seed in exact["per_seed"]}
        gaps[arm] = {"per_seed_points": per_seed, "mean_points": statistics.fmean(per_seed.values()) if per_seed else None,
                     "within_3_points": bool(per_seed) and statistics.fmean(per_seed.values()) >= -JACOBI_GAP_POINTS}
    return gaps


def write_report(places: Sequence[RunPlace], out: Path, report: Path, costs: Mapping[str, Mapping[str, Any]],
                 failed: Mapping[str, str]) -> dict[str, Any]:
    """Copy the per-seed files into `report`, then compute every summary from those copies."""
    report.mkdir(parents=True, exist_ok=True)
    _copy_seed_files(places, out, report)
    for preset, measured in costs.items():
        (report / "costs").mkdir(exist_ok=True)
        (report / "costs" / f"{preset}.json").write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
    results = read_seed_results(report)
    seeds = sorted({seed for by_seed in results.values() for seed in by_seed})
    train_times = read_seed_results(report, TRAIN_TIMES)
    rows = {preset: summary_rows(by_seed, train_times.get(preset)) for preset, by_seed in results.items()}

    figures = {}
    for preset, by_seed in results.items():
        train_n = tuple(next(iter(by_seed.values()))["preset"]["train_n"])
        figures[f"em_vs_n_{preset}"] = plot_accuracy_over_seeds(
            _curves(by_seed), train_n, report / f"em_vs_n_{preset}.png",
            title=f"S5-Retrieval, {preset} preset, seeds {', '.join(map(str, sorted(by_seed)))}")
    gates_figure = _gates_figure(places, report)
    finals, gate_table = _gate_lines(report)
    panels = _fidelity_panels(report)
    for kind, (name, anchor, _, _) in FIDELITY_PANELS.items():
        if panels[kind]:
            figures[name] = plot_cosine_grid(panels[kind], report / f"{name}.png", anchor)
    depth_payload, depth_table = _depth_summary(report, results)
    if depth_payload:
        figures["em_by_path"] = plot_accuracy_by_depth(depth_payload["em_train_by_path"], report / "em_by_path.png",
                                                       "EM on the training lengths (mean over seeds, min–max)")
    gaps = {preset: _jacobi_gap(preset_rows, preset) for preset, preset_rows in rows.items()}
    summary = {"seeds": seeds, "rows": rows, "jacobi_vs_exact_training": gaps, "gates": finals,
               "gradient_fidelity_mean_cosine": {tag: {title: {f"{f},{b}": statistics.fmean(v) for (f, b), v in cells.items()}
                                                       for title, cells in p.items()} for tag, p in panels.items()},
               "eval_paths": depth_payload, "failed": dict(failed)}
    lines = _readme(rows, seeds, costs, gaps, gate_table, panels, depth_table, failed, figures, gates_figure)
    readme, _ = write_result(report, "summary", lines, summary, markdown_stem="README")
    print(f"[s5-evidence] wrote the report: {readme}")
    return summary


def _readme(rows: Mapping[str, Sequence[Mapping[str, Any]]], seeds: Sequence[int], costs: Mapping[str, Any],
            gaps: Mapping[str, Any], gate_table: list[str], panels: Mapping[str, Any], depth_table: list[str],
            failed: Mapping[str, str], figures: Mapping[str, Path], gates_figure: Path | None) -> list[str]:
    lines = [
        "# S5-Retrieval evidence study",
        "",
        ("Written by `t2mlr experiment s5-evidence` (`t2mlr.experiments.s5_evidence`); what the numbers "
        "say is in docs/s5_evidence.md. Every number below is computed from the per-seed files under `seeds/` "
        "(each seed's `results.json` as the experiment wrote it, and the analyses' .json)."),
        "",
        "## Exact match per arm (percent; mean over seeds, min–max in parentheses)",
        "",
        ("EM averages the per-N exact match over the training lengths (train) or the longer evaluation lengths "
        "(beyond), each N weighted equally; training minutes are the optimizer steps' time (see Costs); the last "
        "columns are the per-seed values on the training lengths."),
        "",
    ]
    for preset, preset_rows in rows.items():
        lines += [f"### {preset}", "", *summary_table(preset_rows, seeds), ""]
        if f"em_vs_n_{preset}" in figures:
            lines += [f"![EM vs N, {preset}]({figures[f'em_vs_n_{preset}'].name})", ""]
    lines += ["## Jacobi-trained against exact-trained T²MLR (EM on the training lengths, points)", ""]
    for preset, by_arm in gaps.items():
        for arm, gap in by_arm.items():
            per_seed = ", ".join(f"seed {s}: {v:+.1f}" for s, v in gap["per_seed_points"].items())
            mean = "–" if gap["mean_points"] is None else f"{gap['mean_points']:+.1f}"
            lines.append(f"- {preset}, {label_of(arm)}: mean {mean} ({per_seed}); within {JACOBI_GAP_POINTS:g} points: "
                         f"{'yes' if gap['within_3_points'] else 'no'}")
    lines += ["", "## Costs (measured side by side, one process, one torch thread, paired rounds; medians)", "",
              ("Training step: the trainer's own step on the preset's batches; decoding: generate() from BOS with the "
              "KV cache, per token. Ratios are medians of per-round ratios to the matched Transformer; the FLOP "
              "model (`t2mlr.baselines.costs`) beside them. The machine was shared, so absolute times are inflated; "
              "the ratios are what carries over. The tables above give each run's own training time: its optimizer "
              "steps' seconds read from its step records (metrics.jsonl; checkpoints, evaluation and interruptions "
              "left out), as a mean over seeds and as the mean of each seed's ratio to the exact-trained T²MLR; "
              "they are noisier than the paired measurement here, since the runs shared the machine with each other "
              "and with other jobs."), "",
              *_cost_lines(costs), ""]
    lines += ["## Gates at the end of training", "", *gate_table, ""]
    if gates_figure is not None:
        lines += [f"![gates]({gates_figure.name})", ""]
    lines += ["## Gradient fidelity (mean cosine over seeds to the anchor's gradient, one training batch)", ""]
    for kind, (name, _, heading, alt) in FIDELITY_PANELS.items():
        if panels[kind]:
            lines += [heading, "", *_fidelity_table(panels[kind]), "", f"![{alt}]({figures[name].name})", ""]
    if depth_table:
        lines += [("## Evaluation path of the trained T²MLR models (EM on the training lengths, percent; mean over "
                  "seeds) and the cache's distance from its fixed point (largest over seeds)"), "",
                  ("J d: Jacobi prefill at d_forward d; R off: the recurrence ablated (R never fused), what the model "
                  "does without the state it learned to use."), "", *depth_table, "",
                  f"![EM by evaluation path]({figures['em_by_path'].name})", ""]
    lines += ["## Runs that stopped", ""]
    lines += [f"- `{name}`: {message}" for name, message in failed.items()] or ["None."]
    return lines
