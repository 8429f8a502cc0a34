"""The S5-Retrieval evidence study (t2mlr experiment s5-evidence) at the tiny preset: every arm for every
seed, a failed run recorded and the study continued, nothing retrained on a second call, and a report whose
summary is recomputed here from its per-seed files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from t2mlr.experiments.s5 import run_dir_name
from t2mlr.experiments.s5_evidence import run_study
from t2mlr.experiments.sections import DESIGNS, MAIN_ARMS
from t2mlr.training.metrics import optimizer_step_seconds, read_metrics
from t2mlr.training.trainer import NonFiniteLossError, Trainer

SEEDS = (0, 1)
STUDY = {"overrides": ["train.max_steps=4", "task.baseline_steps=4", "checkpoint.every=2", "train.device=cpu"],
         "workers": 1, "cost_rounds": 2, "decode_rounds": 1}
FAILING = ("seed_1", "tiny", "looped_full_3")  # the run the first call stops on a non-finite loss


def _fail_once_at_step_3(monkeypatch) -> None:
    train_step = Trainer.train_step

    def step(trainer: Trainer, micro_batches):
        if trainer.out_dir.parts[-3:] == FAILING and trainer.step + 1 == 3:
            raise NonFiniteLossError("loss nan at step 3 (injected by the test)")
        return train_step(trainer, micro_batches)

    monkeypatch.setattr(Trainer, "train_step", step)


def _em_means(per_n: dict, lo: int, hi: int) -> float:
    values = [m["exact_match"] for n, m in per_n.items() if lo <= int(n) <= hi]
    return sum(values) / len(values)


def _recompute(report: Path) -> dict[tuple[str, str], dict[int, float]]:
    """(preset, arm) -> seed -> EM on the training lengths, straight from the per-seed results.json copies."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    for path in sorted(report.glob("seeds/seed_*/*/results.json")):
        seed = int(path.parent.parent.name.split("_")[1])
        payload = json.loads(path.read_text())
        lo, hi = payload["preset"]["train_n"]
        for model in payload["models"]:
            found.setdefault((path.parent.name, model["name"]), {})[seed] = _em_means(model["per_n"], lo, hi)
    return found


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_tiny_study_trains_every_arm_records_failures_resumes_and_reports(tmp_path, monkeypatch) -> None:
    out, report = tmp_path / "study", tmp_path / "report"
    _fail_once_at_step_3(monkeypatch)
    first = run_study("tiny", SEEDS, out, report, analyses=False, **STUDY)
    monkeypatch.undo()
    assert list(first["failed"]) == ["s1/tiny/looped:full:3"]  # recorded; every other run finished
    stopped = json.loads((out / "seed_1" / "tiny" / "results.json").read_text())
    assert "loss nan" in stopped["failed"]["looped:full:3"]
    assert "looped:full:3" not in [m["name"] for m in stopped["models"]]

    finished_metrics = (out / "seed_0" / "tiny" / "t2mlr" / "metrics.jsonl").read_text()
    summary = run_study("tiny", SEEDS, out, report, **STUDY)  # continues: the failed run resumes from step 2
    assert summary["failed"] == {}
    assert (out / "seed_0" / "tiny" / "t2mlr" / "metrics.jsonl").read_text() == finished_metrics  # not retrained
    assert "resumed from" in (out / "seed_1" / "tiny" / "looped_full_3" / "train.log").read_text()
    for seed in SEEDS:
        for variant in DESIGNS["tiny"]:
            payload = json.loads((report / "seeds" / f"seed_{seed}" / variant.preset / "results.json").read_text())
            assert [m["name"] for m in payload["models"]] == list(variant.arms)
            for model in payload["models"]:
                assert set(map(int, model["per_n"])) == {1, 2, 3, 4}

    # the summary is what the per-seed files say: mean and spread per arm, recomputed here
    recomputed = _recompute(report)
    rows = {(row["preset"], row["arm"]): row for preset_rows in summary["rows"].values() for row in preset_rows}
    assert set(rows) == set(recomputed) and len(rows) == sum(len(v.arms) for v in DESIGNS["tiny"])
    readme = (report / "README.md").read_text(encoding="utf-8")
    for key, by_seed in recomputed.items():
        stats = rows[key]["em_train"]
        values = [by_seed[s] for s in SEEDS]
        assert stats["seeds"] == len(SEEDS)
        assert stats["mean"] == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert (stats["min"], stats["max"]) == (min(values), max(values))
        cell = f"{100 * statistics.fmean(values):.1f} ({100 * min(values):.1f}–{100 * max(values):.1f})"
        row_line = next(line for line in readme.splitlines() if line.startswith(f"| {key[0]} | {rows[key]['label']} |"))
        assert cell in row_line
    written = json.loads((report / "summary.json").read_text())
    assert written["seeds"] == list(SEEDS)

    # training time: each run's optimizer-step seconds from its own step records, and the ratio to exact T²MLR
    for seed in SEEDS:
        times = json.loads((report / "seeds" / f"seed_{seed}" / "tiny" / "train_time.json").read_text())
        assert set(times) == set(MAIN_ARMS)
        for arm, seconds in times.items():
            run_dir = out / f"seed_{seed}" / "tiny" / run_dir_name(arm)
            assert seconds == optimizer_step_seconds(read_metrics(run_dir)) > 0
            assert rows[("tiny", arm)]["per_seed"][seed]["train_seconds"] == seconds
        assert rows[("tiny", "pause:2")]["per_seed"][seed]["train_time_ratio"] == pytest.approx(
            times["pause:2"] / times["t2mlr"])
    mean_minutes = statistics.fmean(rows[("tiny", "pause:2")]["per_seed"][s]["train_seconds"] for s in SEEDS) / 60
    pause_line = next(line for line in readme.splitlines() if line.startswith(f"| tiny | {rows[('tiny', 'pause:2')]['label']} |"))
    assert f"| {mean_minutes:.1f} |" in pause_line

    # the analyses ran on every trained T²MLR model: gates, gradient fidelity (mid and final), Jacobi depths
    for seed in SEEDS:
        analyses = report / "seeds" / f"seed_{seed}" / "analyses"
        gates = json.loads((analyses / "gates" / "gates.json").read_text())
        assert len(gates["runs"]) == 4  # three T²MLR arms on tiny, one on tiny-deep
        for arm in (a for a in MAIN_ARMS if a.startswith("t2mlr")):
            for when in ("mid_32", "final_32"):
                fidelity = json.loads((analyses / "gradient_fidelity" / f"{run_dir_name(arm)}_{when}" /
                                       "gradient_fidelity.json").read_text())
                assert len(fidelity["settings"]) == 9 and fidelity["batch_shape"][0] == 64
            depths = json.loads((analyses / "jacobi_depths" / f"tiny_{run_dir_name(arm)}" / "jacobi_depths.json").read_text())
            assert [row["d_forward"] for row in depths["depths"]] == [2, 4, 8, 16, 32]
            # rows of the tiny preset are at most 16 tokens: from depth 16 on, the Jacobi path is the exact one
            assert all(row["argmax_agreement"] == 1.0 for row in depths["depths"] if row["d_forward"] >= 16)
            by_path = json.loads((analyses / "jacobi_depths" / f"tiny_{run_dir_name(arm)}" /
                                  "s5_eval_by_path.json").read_text())["paths"]
            assert list(by_path) == ["jacobi_2", "jacobi_4", "jacobi_8", "jacobi_16", "jacobi_32", "off"]
    for figure in ("em_vs_n_tiny.png", "em_vs_n_tiny-deep.png", "gates.png", "gradient_fidelity.png", "em_by_path.png"):
        assert (report / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a study written before the recurrence-off evaluation existed gains it on the next call, and only it
    older = out / "seed_1" / "analyses" / "jacobi_depths" / "tiny_t2mlr" / "s5_eval_by_path.json"
    written_paths = json.loads(older.read_text())["paths"]
    older.write_text(json.dumps({"model_dir": "x", "paths": {k: v for k, v in written_paths.items() if k != "off"}}))
    stamps = {p: p.stat().st_mtime_ns for p in (out / "seed_0" / "analyses").rglob("*.json")}
    third = run_study("tiny", SEEDS, out, report, **STUDY)  # a third call: nothing to train, no analysis repeated
    assert {p: p.stat().st_mtime_ns for p in (out / "seed_0" / "analyses").rglob("*.json")
            if "gates" not in p.parts} == {p: t for p, t in stamps.items() if "gates" not in p.parts}
    assert json.loads(older.read_text())["paths"] == written_paths
    assert "| R off |" in (report / "README.md").read_text()

    # --report-only: the same report from what OUT holds; nothing under OUT is written (nor trained, evaluated...)
    kept = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = run_study("tiny", SEEDS, out, tmp_path / "again", report_only=True, **STUDY)
    assert again["rows"] == third["rows"] and again["failed"] == {}
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == kept
    assert (tmp_path / "again" / "README.md").read_text() == (report / "README.md").read_text()
    with pytest.raises(ValueError, match="seed_7"):
        run_study("tiny", (0, 7), out, tmp_path / "never", report_only=True)
    assert not (tmp_path / "never").exists() and not (out / "seed_7").exists()
