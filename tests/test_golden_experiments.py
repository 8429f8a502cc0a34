"""Every experiment's numbers are unchanged: each paper experiment and training analysis, run at a tiny scale
through the command line, writes the same results, predictions, per-step metrics, trainer configs and data
as the code before the experiments' restructuring (tests/golden_experiments.py says what is compared and
how the fixtures were recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_experiments import (
    RUNS,
    GoldenRun,
    as_recorded_today,
    cpu_kernels,
    differences,
    fixture_path,
    masked_report,
    read_fixture,
    recorded_kernels,
    report_differences,
    run_golden,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_outputs_match_the_recorded_ones(run: GoldenRun, tmp_path: Path) -> None:
    if not fixture_path(run.name).is_file():
        pytest.skip(f"no golden outputs recorded for {cpu_kernels()} CPU kernels (recorded: "
                    f"{', '.join(recorded_kernels())}); tests/golden_experiments.py says how to record them")
    found, reports = run_golden(run, tmp_path)
    recorded = as_recorded_today(read_fixture(run.name), found)
    diffs = differences(recorded, found)
    assert not diffs, f"{run.name} differs from {fixture_path(run.name)}:\n" + "\n".join(diffs[:60])
    diffs = report_differences(read_fixture(run.name, reports=True), reports)
    assert not diffs, f"{run.name}'s reports differ from {fixture_path(run.name, reports=True)}:\n" + "\n".join(diffs[:60])


def test_both_kernel_sets_hold_every_run() -> None:
    """AVX2 and AVX512 machines each have every run's outputs, recorded apart, and they differ (else one
    set would do, or one was copied from the other)."""
    assert {"AVX2", "AVX512"} <= set(recorded_kernels())
    for run in RUNS:
        avx2, avx512 = read_fixture(run.name, "AVX2"), read_fixture(run.name, "AVX512")
        assert avx2.keys() == avx512.keys(), run.name
        avx2, avx512 = read_fixture(run.name, "AVX2", reports=True), read_fixture(run.name, "AVX512", reports=True)
        assert avx2.keys() == avx512.keys() and avx2, run.name
    assert any(differences(read_fixture(run.name, "AVX2"), read_fixture(run.name, "AVX512")) for run in RUNS)


def test_report_masking_hides_the_measured_and_keeps_the_computed() -> None:
    """Two runs of one report that differ only in measured times read the same; a computed number that
    changes, in a table or in the text, does not."""
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


def test_the_comparison_sees_a_changed_number() -> None:
    recorded = {"results.json": {"models": [{"loss": 1.25, "train_seconds": 3.0}]}}
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.25, "train_seconds": 3.0}]}}) == []
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.2500001, "train_seconds": 3.0}]}})
    assert differences(recorded, {"results.json": {"models": []}})
    assert differences(recorded, {})
