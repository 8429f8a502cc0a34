"""S5-Retrieval with actions drawn from a small generating set of S5 (the CPU preset's one deviation).

Why: with actions uniform over all 120 permutations a model must learn the 120 × 120 composition
table before any state is right. Measured on 2 CPU cores (K = 1, 8-key dictionary, N 1–8, batch 64):
T²MLR(1,2) on a 2-block, 64-wide Llama trained on the exact path for 3000 steps (12 min), and
2-block Transformers 64 or 128 wide (600–2000 steps), all stay at the "copy the first action, guess a
dictionary value" floor (4–5% exact match, 36% token accuracy); a 128-unit GRU trained on the bare
state-tracking problem with a label at every step still gets the third state wrong 40% of the time
after 20k steps. Drawing the actions from a fixed set A of m elements that *generates* S5 shrinks the
table to 120 × m (the same GRU learns m = 2 or 4 within 1000 steps) and keeps what the experiment is
about: the states still range over all of S5 (a non-solvable group, so tracking them needs depth
growing with N for a Transformer, SPEC §7 / Barrington), and retrieval is unchanged (D is still a
fresh random map on S5 per sequence). The paper preset uses all of S5 through `t2mlr.tasks`.

Samples follow `t2mlr.tasks.s5_retrieval`'s layout and JSONL schema exactly (the tests check them with
its independent `s5_targets_from_input`); only the action distribution differs.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from t2mlr.tasks.s5 import ELEMENTS, IDENTITY, Perm, compose, perm_to_token, running_products
from t2mlr.tasks.s5_retrieval import BLANK, DELIMITER, validate_alphabet

__all__ = ["generates_s5", "generating_set", "make_restricted_sample"]

GROUP_ORDER = len(ELEMENTS)


def generates_s5(elements: Iterable[Perm]) -> bool:
    """True iff the closure of `elements` under composition is all of S5 (breadth-first search)."""
    gens = list(elements)
    seen = {IDENTITY}
    frontier = [IDENTITY]
    while frontier:
        frontier = [g for g in (compose(p, a) for p in frontier for a in gens) if g not in seen]
        frontier = list(dict.fromkeys(frontier))
        seen.update(frontier)
    return len(seen) == GROUP_ORDER


def generating_set(size: int, seed: int) -> tuple[Perm, ...]:
    """`size` distinct non-identity permutations, seeded, redrawn until they generate S5."""
    if not 2 <= size <= GROUP_ORDER - 1:
        raise ValueError(f"an action set that generates S5 needs 2..{GROUP_ORDER - 1} elements, got {size}")
    rng = random.Random(f"t2mlr/s5-actions/{size}/{seed}")
    candidates = [p for p in ELEMENTS if p != IDENTITY]
    for _ in range(1000):
        chosen = tuple(sorted(rng.sample(candidates, size)))
        if generates_s5(chosen):
            return chosen
    raise RuntimeError(f"no generating set of size {size} found for seed {seed}")  # practically impossible


def _keys(rng: random.Random, states: Sequence[Perm], dict_size: int) -> list[Perm]:
    """Every visited state, then random other keys up to `dict_size`, shuffled (as the tasks generator)."""
    needed = list(dict.fromkeys(states))
    if len(needed) > dict_size:
        raise ValueError(f"dict_size={dict_size} is smaller than the {len(needed)} states this sample visits")
    others = [p for p in ELEMENTS if p not in set(needed)]
    keys = needed + rng.sample(others, dict_size - len(needed))
    rng.shuffle(keys)
    return keys


def make_restricted_sample(
    rng: random.Random, n: int, k: int, dict_size: int, alphabet: str, actions: Sequence[Perm]
) -> dict[str, Any]:
    """One S5-Retrieval sample whose N actions are drawn uniformly from `actions`."""
    if n < 1 or k < 1 or not actions:
        raise ValueError(f"need n >= 1, k >= 1 and a non-empty action set, got n={n}, k={k}")
    validate_alphabet(alphabet)
    chosen = [rng.choice(list(actions)) for _ in range(n)]
    states = running_products(chosen)
    keys = _keys(rng, states, dict_size)
    values = {key: [rng.choice(alphabet) for _ in range(k)] for key in keys}
    dictionary = [sym for key in keys for sym in (perm_to_token(key), *values[key])]
    inputs, targets = [*dictionary, DELIMITER], [*dictionary, DELIMITER]
    for action, state in zip(chosen, states):
        inputs += [perm_to_token(action), *([BLANK] * k)]
        targets += [perm_to_token(state), *values[state]]
    score_start = len(dictionary) + 1
    return {
        "input_tokens": inputs,
        "target_tokens": targets,
        "n": n,
        "k": k,
        "dict_size": dict_size,
        "delim_index": len(dictionary),
        "score_start": score_start,
        "score_mask": [0] * score_start + [1] * (len(inputs) - score_start),
    }
