"""The symmetric group S5, written out explicitly for the S5-Retrieval task.

Conventions (fixed here, relied on by the generator, the tokenizer and the tests):

* A permutation is a tuple ``p`` of the five integers 1..5 in one-line notation: ``p[i - 1]``
  is the image ``p(i)``. ``(3, 2, 5, 1, 4)`` maps 1→3, 2→2, 3→5, 4→1, 5→4.
* Element order: ``ELEMENTS`` lists all 120 permutations in lexicographic order of their
  one-line tuples, so ``ELEMENTS[0]`` is the identity ``(1, 2, 3, 4, 5)`` and ``ELEMENTS[119]``
  is ``(5, 4, 3, 2, 1)``. ``index_of`` is the inverse of this listing.
* Composition: ``compose(p, q)`` is ``p ∘ q`` with ``(p ∘ q)(x) = p(q(x))``, i.e. ``q`` is
  applied first. The running state of an action sequence is the left-to-right product
  ``state_i = a_1 ∘ a_2 ∘ … ∘ a_i = state_{i-1} ∘ a_i``. This reproduces the paper's
  data-example table: actions 54213, 43125, 52314 give states 54213, 12543, 32514.
* Token names: ``<A_32514>`` is the permutation ``(3, 2, 5, 1, 4)``.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterable, Sequence

Perm = tuple[int, ...]

DEGREE = 5
IDENTITY: Perm = tuple(range(1, DEGREE + 1))
ELEMENTS: tuple[Perm, ...] = tuple(itertools.permutations(IDENTITY))
_INDEX: dict[Perm, int] = {p: i for i, p in enumerate(ELEMENTS)}
_TOKEN_RE = re.compile(r"<A_([1-5]{5})>")


def validate_perm(p: Sequence[int]) -> Perm:
    """Return ``p`` as a tuple, or raise ValueError: callers pass user data, fail early."""
    t = tuple(p)
    if t not in _INDEX:
        raise ValueError(f"not a permutation of 1..{DEGREE} in one-line notation: {p!r}")
    return t


def compose(p: Sequence[int], q: Sequence[int]) -> Perm:
    """``p ∘ q``: apply ``q`` first, then ``p`` (``(p∘q)(x) = p(q(x))``)."""
    p, q = validate_perm(p), validate_perm(q)
    return tuple(p[q[x] - 1] for x in range(DEGREE))


def inverse(p: Sequence[int]) -> Perm:
    """The permutation ``r`` with ``compose(p, r) == compose(r, p) == IDENTITY``."""
    p = validate_perm(p)
    return tuple(p.index(x) + 1 for x in IDENTITY)  # r(x): the point that p sends to x


def running_products(actions: Iterable[Sequence[int]]) -> list[Perm]:
    """States ``[a_1, a_1∘a_2, …]``: the targets of the state-tracking part of the task."""
    return list(itertools.accumulate(actions, compose, initial=IDENTITY))[1:]


def index_of(p: Sequence[int]) -> int:
    """Position of ``p`` in ``ELEMENTS`` (lexicographic order)."""
    return _INDEX[validate_perm(p)]


def perm_to_token(p: Sequence[int]) -> str:
    """``(3, 2, 5, 1, 4)`` → ``"<A_32514>"``."""
    return "<A_" + "".join(str(x) for x in validate_perm(p)) + ">"


def token_to_perm(token: str) -> Perm:
    """``"<A_32514>"`` → ``(3, 2, 5, 1, 4)``; ValueError for anything else."""
    m = _TOKEN_RE.fullmatch(token)
    if m is None:
        raise ValueError(f"not an S5 action token: {token!r}")
    return validate_perm(int(c) for c in m.group(1))


def is_perm_token(token: str) -> bool:
    """True iff ``token`` names one of the 120 permutations."""
    m = _TOKEN_RE.fullmatch(token)
    return m is not None and tuple(int(c) for c in m.group(1)) in _INDEX


ALL_TOKENS: tuple[str, ...] = tuple(perm_to_token(p) for p in ELEMENTS)


def generates_s5(elements: Iterable[Perm]) -> bool:
    """True iff the closure of ``elements`` under composition is all of S5 (breadth-first search)."""
    gens = list(elements)
    seen = {IDENTITY}
    frontier = {IDENTITY}
    while frontier:
        frontier = {compose(p, a) for p in frontier for a in gens} - seen
        seen |= frontier
    return len(seen) == len(ELEMENTS)


def generating_set(size: int, seed: int) -> tuple[Perm, ...]:
    """``size`` distinct non-identity permutations, seeded, redrawn until they generate S5.

    Why a generating set: with actions uniform over all 120 permutations a model must learn the
    120 × 120 composition table before any state is right, which no CPU-sized model does within
    minutes (measured: 2-block models 64–128 wide stay at the copy-and-guess floor after 3000 steps).
    Actions drawn from a fixed set of m elements that generates S5 shrink the table to 120 × m and keep
    what the task is about: the states still range over all of S5 (a non-solvable group, so tracking
    them needs depth growing with N for a Transformer), and retrieval is unchanged.
    """
    if not 2 <= size <= len(ELEMENTS) - 1:
        raise ValueError(f"an action set that generates S5 needs 2..{len(ELEMENTS) - 1} elements, got {size}")
    rng = random.Random(f"t2mlr/s5-actions/{size}/{seed}")
    candidates = [p for p in ELEMENTS if p != IDENTITY]
    for _ in range(1000):
        chosen = tuple(sorted(rng.sample(candidates, size)))
        if generates_s5(chosen):
            return chosen
    raise RuntimeError(f"no generating set of size {size} found for seed {seed}")  # practically impossible
