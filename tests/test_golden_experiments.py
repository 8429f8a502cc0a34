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
    read_fixture,
    recorded_kernels,
    run_golden,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_outputs_match_the_recorded_ones(run: GoldenRun, tmp_path: Path) -> None:
    if not fixture_path(run.name).is_file():
        pytest.skip(f"no golden outputs recorded for {cpu_kernels()} CPU kernels (recorded: "
                    f"{', '.join(recorded_kernels())}); tests/golden_experiments.py says how to record them")
    found = run_golden(run, tmp_path)
    recorded = as_recorded_today(read_fixture(run.name), found)
    diffs = differences(recorded, found)
    assert not diffs, f"{run.name} differs from {fixture_path(run.name)}:\n" + "\n".join(diffs[:60])


def test_both_kernel_sets_hold_every_run() -> None:
    """AVX2 and AVX512 machines each have every run's outputs, recorded apart, and they differ (else one
    set would do, or one was copied from the other)."""
    assert {"AVX2", "AVX512"} <= set(recorded_kernels())
    for run in RUNS:
        avx2, avx512 = read_fixture(run.name, "AVX2"), read_fixture(run.name, "AVX512")
        assert avx2.keys() == avx512.keys(), run.name
    assert any(differences(read_fixture(run.name, "AVX2"), read_fixture(run.name, "AVX512")) for run in RUNS)


def test_the_comparison_sees_a_changed_number() -> None:
    recorded = {"results.json": {"models": [{"loss": 1.25, "train_seconds": 3.0}]}}
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.25, "train_seconds": 3.0}]}}) == []
    assert differences(recorded, {"results.json": {"models": [{"loss": 1.2500001, "train_seconds": 3.0}]}})
    assert differences(recorded, {"results.json": {"models": []}})
    assert differences(recorded, {})
