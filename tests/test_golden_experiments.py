"""Every experiment's numbers are unchanged on any CPU: each paper experiment and training analysis, run at a tiny
scale through the command line, writes the same files, loss curves and headline numbers as recorded, to the
kernel sets' measured spread (tests/golden_experiments.py says what is compared, at which tolerance and why),
and reports of the same structure. The bit-exact comparison against this machine's own recording is the opt-in
refactoring oracle (`pytest -m golden`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from golden_experiments import (
    ATOL,
    RTOL,
    RUNS,
    GoldenRun,
    differences,
    masked_report,
    oracle_differences,
    oracle_path,
    read_summary,
    report_differences,
    report_structure,
    summarise,
    summary_differences,
    summary_path,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_outputs_match_the_recorded_curves_and_headline_numbers(run: GoldenRun, tmp_path: Path) -> None:
    out = run.run(tmp_path)
    diffs = summary_differences(read_summary(run.name), summarise(out, tmp_path), run.eval_examples)
    assert not diffs, f"{run.name} differs from {summary_path(run.name)}:\n" + "\n".join(diffs[:60])


@pytest.mark.golden
@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_outputs_are_bit_for_bit_this_machines_recording(run: GoldenRun, tmp_path: Path) -> None:
    """The refactoring oracle: every value and report line as this machine recorded them before the change
    (`python tests/golden_experiments.py --record-oracle`)."""
    if not oracle_path(run.name).is_file():
        pytest.skip(f"nothing recorded in {oracle_path(run.name)}: run `PYTHONPATH=src python "
                    f"tests/golden_experiments.py --record-oracle {run.name}` before the change")
    diffs = oracle_differences(run.name, run.run(tmp_path), tmp_path)
    assert not diffs, f"{run.name} differs from {oracle_path(run.name)}:\n" + "\n".join(diffs[:60])


def test_one_recording_for_every_cpu() -> None:
    """One summary per run, for every kernel set (no per-instruction-set folders), each with files, numbers and
    reports."""
    folders = sorted(p.name for p in summary_path(RUNS[0].name).parent.iterdir() if p.is_dir())
    assert folders == ["inputs"]
    for run in RUNS:
        recorded = read_summary(run.name)
        assert recorded["files"] and recorded["numbers"] and recorded["reports"], run.name
        assert all(math.isfinite(n) for numbers in recorded["numbers"].values() for n in numbers.values())


def summary(numbers: dict, files: tuple[str, ...] = ("results.json", "results.md"), reports: dict | None = None,
            nonfinite: tuple[str, ...] = ()) -> dict:
    return {"files": list(files), "numbers": {"results.json": numbers}, "nonfinite": list(nonfinite),
            "reports": reports if reports is not None else {"results.md": ["# Results", "table: model | EM (2 rows)"]}}


def test_the_comparison_passes_kernel_noise_and_sees_a_changed_number() -> None:
    """Kernel-set noise passes; a loss moved by a real change, a count off by two, a fraction off by two examples,
    a changed integer, a missing file or number, a non-finite number and a changed report structure fail."""
    recorded = summary({"/loss": 4.6901, "/losses[0]": 4.6901, "/gap": -2.77e-4, "/solved": 3, "/accuracy": 0.3,
                        "/parameters": 8610})

    def now(**changes) -> dict:
        return summary({**recorded["numbers"]["results.json"], **changes})

    assert summary_differences(recorded, now(), 10) == []
    noise = now(**{"/loss": 4.6901 * (1 + 1e-6), "/gap": -2.77e-4 + 2.4e-7})  # the AVX2/AVX512 spread
    assert summary_differences(recorded, noise, 10) == []
    one_flip = now(**{"/solved": 4, "/accuracy": 0.4})  # one greedy answer of ten flipped
    assert summary_differences(recorded, one_flip, 10) == []
    changed = (("/loss", 4.6901 + 1e-3), ("/losses[0]", 4.6901 * (1 + 10 * RTOL)), ("/gap", -2.77e-4 + 10 * ATOL),
               ("/solved", 5), ("/accuracy", 0.5), ("/parameters", 8611), ("/loss", math.nan), ("/accuracy", math.inf))
    for place, value in changed:
        assert summary_differences(recorded, now(**{place: value}), 10), (place, value)
    missing_number = now()
    del missing_number["numbers"]["results.json"]["/gap"]
    assert summary_differences(recorded, missing_number, 10) == ["results.json/gap: missing now"]
    assert summary_differences(recorded, summary(recorded["numbers"]["results.json"], files=("results.json",)), 10)
    numbers = recorded["numbers"]["results.json"]
    assert summary_differences(recorded, summary(numbers, nonfinite=("predictions.jsonl[0]/f1",)), 10)
    fewer_rows = summary(numbers, reports={"results.md": ["# Results", "table: model | EM (1 rows)"]})
    assert summary_differences(recorded, fewer_rows, 10)


def test_a_report_is_compared_by_its_structure_not_its_prose() -> None:
    def report(prose: str, rows: int, column: str = "EM") -> str:
        table = "\n".join(f"| arm {i} | {i}.5% | 1{i} s |" for i in range(rows))
        header = f"| model | {column} | time |\n|---|---:|---:|"
        return f"# Results ({prose} run, 12 s)\n\n{prose} text.\n\n{header}\n{table}\n"

    structure = report_structure(report("one", 2))
    assert structure == ["# Results (one run, <measured>)", "table: model | EM | time (2 rows)"]
    assert report_structure(report("one", 2).replace("12 s", "40 s")) == structure
    assert report_structure(report("another", 2)) != structure  # a heading is structure
    assert report_structure(report("one", 3)) != structure
    assert report_structure(report("one", 2, column="accuracy")) != structure


def test_report_masking_hides_the_measured_and_keeps_the_computed() -> None:
    """The oracle's report comparison: two runs of one report that differ only in measured times read the same;
    a computed number that changes, in a table or in the text, does not."""
    def report(seconds: str, ratio: str, accuracy: str, chosen: str) -> str:
        return (f"Whole experiment: {seconds} s, on 1 thread; 2 steps, accuracy {accuracy}%; {ratio}× the anchor.\n\n"
                f"| model | parameters | training time | × matched | FLOP model | EM |\n|---|---:|---:|---:|---:|---:|\n"
                f"| T²MLR | 8,610 | {seconds} s | {ratio}× | 0.99× | {accuracy}% |\n\n"
                f"Cheapest setting with cosine ≥ 0.99: {chosen} ({seconds} s).\n")

    masked = masked_report(report("1.5", "0.74", "8.3", "d_forward 2"), "/root")
    assert masked == masked_report(report("12", "1.02", "8.3", "d_forward 4"), "/root")
    assert masked != masked_report(report("1.5", "0.74", "9.1", "d_forward 2"), "/root")
    assert masked[0] == "Whole experiment: <measured>, on 1 thread; 2 steps, accuracy 8.3%; <measured> the anchor."
    assert masked[2] == "model | parameters | training time | × matched | FLOP model | EM"
    assert masked[4] == "T²MLR | 8,610 | <measured> | <measured> | 0.99× | 8.3%"
    assert masked[6] == "<measured>"
    assert report_differences({"a.md": masked}, {"a.md": masked}) == []
    assert report_differences({"a.md": masked}, {"a.md": masked[:-1]})
    assert report_differences({"a.md": masked}, {})


def test_the_oracle_sees_any_changed_bit() -> None:
    recorded = {"results.json": {"models": [{"loss": 1.25, "steps": 3}]}}
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.25, "steps": 3}]}}) == []
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.2500001, "steps": 3}]}})
    assert differences(recorded, {"results.json": {"models": []}})
    assert differences(recorded, {})
