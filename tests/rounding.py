"""Tolerances for two float32 computations of one quantity, derived from what float32 does on this machine.

Two float32 computations of the same values by different kernels (vLLM's engine and `generate()`, one-token
decode steps and one pass over the whole sequence, a compiled graph and eager code, a batch and one row)
differ by their rounding, and the rounding depends on the CPU's kernel set: AVX2, AVX512 and the plain
default kernels each add up in their own order. A constant picked on one kernel set fails on another (2e-5
against a measured 2.48e-5 on an AVX2 machine, issue 49). So each such test measures how far float32 lands
from float64 on its own reference path and input, here and now (`float32_gap`), and allows `MARGIN` times
that (`float32_tolerance`).

Why `MARGIN` = 10: each float32 computation is about `gap` away from the float64 value, so two of them differ
by up to about 2·gap when their errors do not cancel; the other kernels or path may round a few times worse
than the measured one (a longer reduction, a fused kernel, another summation order), which the rest covers.
Measured on AVX2: vLLM's first-token log-probabilities of SmolLM2-135M were 1.0 to 1.2 gaps from `generate()`'s
(gap 2.5e-5). The floor, `FLOOR_ULPS` units in the last place of the largest value (or of the terms a
cancelling sum adds up, `scale`), keeps a gap that happens to be tiny from asking for bit-equality; on the tiny
test models it is the binding term, and their differences stay below 10% of it. `compute(dtype)` must do its
arithmetic in `dtype` as well, so that the gap holds the rounding of the sums the tested code makes (a mean
over many tokens, say), not only of the model's weights.

A real defect stays orders of magnitude above: a recurrent state read one position late moved vLLM's SmolLM2
log-probabilities 358 times the tolerance (0.089 against 2.5e-4) and `generate()`'s Jacobi-prefill logits by
0.2 against a tolerance of 1e-6; a state 0.1% off, a far smaller error, moved the tiny model's 5 times and
SmolLM2's 1.02 times the tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

MARGIN = 10.0
FLOOR_ULPS = 16.0
FLOAT32_EPS = torch.finfo(torch.float32).eps


def float32_gap(compute: Callable[[torch.dtype], torch.Tensor]) -> tuple[float, float]:
    """(largest |float32 − float64|, largest |float64|) of `compute(dtype)`, which computes the same values
    in the given dtype (e.g. a model's logits with the model cast to it)."""
    wide = compute(torch.float64).double()
    narrow = compute(torch.float32).double()
    return float((narrow - wide).abs().max()), float(wide.abs().max())


def float32_tolerance(compute: Callable[[torch.dtype], torch.Tensor], margin: float = MARGIN,
                      scale: float | None = None) -> float:
    """`margin` times float32's gap to float64 on `compute`'s path (`float32_gap`), at least `FLOOR_ULPS`
    units in the last place of the largest value, or of `scale` where the value is a sum of larger terms that
    cancel (a loss weighted by advantages of both signs). `compute(dtype)` does its arithmetic in `dtype`
    too, so that the gap holds float32's rounding of the sums the computation under test makes."""
    gap, largest = float32_gap(compute)
    return max(margin * gap, FLOOR_ULPS * FLOAT32_EPS * (largest if scale is None else max(scale, largest)))


def in_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` with its floating-point weights in `dtype` (the model itself is left as it is), running
    its class's own forward: a forward a trainer patched onto the instance (accelerate's, under TRL) would still
    compute with the original's weights, and cast the outputs to float32."""
    clone = copy.deepcopy(model).to(dtype)
    clone.__dict__.pop("forward", None)
    return clone


def forward_tolerance(model: torch.nn.Module, ids: torch.Tensor, output: str = "logits", **inputs: object) -> float:
    """`float32_tolerance` of one output of the model's forward over `ids` (its logits unless named;
    `inputs`: further forward arguments, e.g. the path)."""
    def computed(dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return getattr(in_dtype(model, dtype)(ids, **inputs), output)

    return float32_tolerance(computed)
