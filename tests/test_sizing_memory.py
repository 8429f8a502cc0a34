"""The dry run's memory estimate against what a training step really holds, on the CPU (torch's allocator,
through the profiler's allocation events: see benchmarks/memory_estimate.py for why not RSS).

Three small shapes (grouped-query Llama, multi-head Llama with the seed pass in the gradient set, Qwen3 with
q/k norms and one key/value head) on both T²MLR training paths: the estimate of weights + gradients + AdamW
state + activations must be within 15% of the measured peak of the trainer's second step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_benchmarks import load_script

bench = load_script("memory_estimate")


def test_the_instrument_sees_a_freed_allocation_and_counts_shared_storage_once() -> None:
    def allocate_and_free() -> None:
        block = torch.empty(1000, 1000)  # 4,000,000 bytes, freed on return
        del block

    assert bench.peak_allocated(allocate_and_free) == pytest.approx(4_000_000, abs=4096)
    weight = torch.zeros(10, 20)
    assert bench.storage_bytes([weight, weight.t(), weight[:5]]) == 800  # one storage, however viewed


@pytest.mark.parametrize("case", bench.REQUIRED, ids=lambda case: case.name)
def test_estimate_is_within_15_percent_of_the_measured_peak(case, tmp_path: Path) -> None:
    cfg = bench.case_config(case)
    measured, estimate = bench.measure(cfg, tmp_path)
    assert estimate.activations_total > 0.4 * estimate.peak, "activations must weigh in what is validated"
    assert abs(estimate.peak / measured - 1) <= 0.15, (
        f"{case.name}: estimated {estimate.peak:,.0f} bytes, measured {measured:,.0f}\n{estimate}"
    )


def test_detached_jacobi_iterates_keep_nothing_and_each_gradient_pass_one_middle_block(tmp_path: Path) -> None:
    """Measured, not estimated: more detached iterates (d_forward) leave the peak unchanged; one more
    gradient-carrying iterate (d_backward) adds what the estimate says one more middle pass keeps."""
    def measured(d_forward: int, d_backward: int) -> tuple[float, float]:
        case = bench.t2mlr_case("llama-gqa", "jacobi")
        model = {**case.model, "d_forward": d_forward, "d_backward": d_backward}
        cfg = bench.case_config(bench.Case(case.shape, case.path, model))
        peak, estimate = bench.measure(cfg, tmp_path / f"{d_forward}_{d_backward}")
        return peak, estimate.peak

    base, base_estimate = measured(4, 2)
    deeper, deeper_estimate = measured(8, 2)
    more_gradients, more_estimate = measured(4, 3)
    assert abs(deeper / base - 1) < 0.02 and deeper_estimate == base_estimate
    assert more_estimate > base_estimate
    assert (more_gradients - base) == pytest.approx(more_estimate - base_estimate, rel=0.15)
