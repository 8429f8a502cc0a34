"""Deterministic sample streams shared by the task generators.

Every generator draws its samples from one `random.Random` seeded by (task, stream, seed), so a
training and an evaluation stream of the same seed never share samples, and the first k samples are
the same whatever the requested count (a caller can stop early or show progress and still get exactly
what the list-returning `generate_*` function gives).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["distinct_words", "seeded_samples"]


def seeded_samples(
    task: str, num_samples: int | None, seed: int, stream: str, draw: Callable[[random.Random], dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """`num_samples` results of `draw(rng)` (None: without end) from the stream named by (task, stream, seed).

    The count is checked on the call, not when the first sample is drawn.
    """
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    rng = random.Random(f"t2mlr/{task}/{stream}/{seed}")
    counter = itertools.count() if num_samples is None else range(num_samples)
    return (draw(rng) for _ in counter)


def distinct_words(rng: random.Random, count: int, word: Callable[[random.Random], str]) -> list[str]:
    """`count` different results of `word(rng)` in an order drawn from `rng` (sorted first, so the order does not
    depend on how a set iterates): the made-up names the graph tasks give their nodes."""
    names: set[str] = set()
    while len(names) < count:
        names.add(word(rng))
    ordered = sorted(names)
    rng.shuffle(ordered)
    return ordered
