"""Variable assignment (a "reasoning primitive" of Saunshi et al. 2024), made deeper (depth 5).

A sample lists constant assignments (``c=8``) and then chains of variable-to-variable
assignments (``x=c``, ``y=x``, ``z=y``); the question asks for the digit of the last variable
of one chain. **Depth** is the number of variable-to-variable hops from the queried variable
back to its constant (the paper's example, ``z=y, y=x, x=c, c=8``, has depth 3).

Construction (all from a seeded ``random.Random``):

* ``num_constants`` distinct variables get distinct digits, so different chains end in
  different answers.
* The queried chain starts at a random constant and has ``depth`` hops; each of the
  ``num_distractors`` distractor chains also has ``depth`` hops (chain length is no cue) and,
  when possible, starts at a different constant from the queried chain.
* Variables are distinct lowercase letters, so ``num_constants + depth·(1 + num_distractors)``
  must be at most 26; no variable is assigned twice.
* With ``min_depth`` set, each sample draws its depth uniformly from ``min_depth..depth``: a mix of
  easy and hard samples, so a small model trained from scratch gets a learning signal from the
  shallow ones (depth 0 asks for a constant itself) before it can solve the deep ones.
* Lines: the constants first (shuffled), then the chains' assignments interleaved at random,
  each chain kept in order (a variable is defined before it is used).

Prompt format (the paper's data-example table)::

    Variable assignment. Follow the assignments and fill in the blank.
    a=5
    ...
    z=___
    Answer: |

and the target is the answer digit, to be generated right after ``|``.

JSONL schema: ``prompt`` (str), ``target`` (str, the text to generate: the digit), ``answer``
(str, the digit), ``query`` (str, the variable asked for), ``depth`` (int), ``assignments``
(list of ``[lhs, rhs]`` pairs in prompt order).
"""

from __future__ import annotations

import itertools
import random
import re
import string
from collections.abc import Iterator
from typing import Any

from t2mlr.tasks.sampling import seeded_samples

__all__ = [
    "HEADER",
    "generate_variable_assignment",
    "iter_variable_assignment",
    "solve_variable_assignment",
]

HEADER = "Variable assignment. Follow the assignments and fill in the blank."
_LINE = re.compile(r"([a-z])=([a-z0-9])")
_QUERY = re.compile(r"([a-z])=___")


def _validate(depth: int, num_constants: int, num_distractors: int, min_depth: int | None = None) -> None:
    """Refuse configurations that cannot be built with distinct letters and digits."""
    if depth < 0 or num_distractors < 0:
        raise ValueError(f"depth and num_distractors must be >= 0, got {depth}, {num_distractors}")
    if min_depth is not None and not 0 <= min_depth <= depth:
        raise ValueError(f"min_depth must be in 0..depth ({depth}), got {min_depth}")
    if not (1 <= num_constants <= 10):
        raise ValueError(f"num_constants must be in 1..10 (distinct digits), got {num_constants}")
    needed = num_constants + depth * (1 + num_distractors)
    if needed > len(string.ascii_lowercase):
        raise ValueError(f"needs {needed} distinct variables but only 26 letters exist")


def _interleave(rng: random.Random, chains: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """Random merge of the chains that keeps each chain's own order."""
    queues = [list(c) for c in chains if c]
    merged: list[tuple[str, str]] = []
    while queues:
        i = rng.randrange(len(queues))
        merged.append(queues[i].pop(0))
        if not queues[i]:
            queues.pop(i)
    return merged


def _make_sample(rng: random.Random, depth: int, num_constants: int, num_distractors: int,
                 min_depth: int | None = None) -> dict[str, Any]:
    if min_depth is not None:
        depth = rng.randint(min_depth, depth)
    letters = rng.sample(string.ascii_lowercase, num_constants + depth * (1 + num_distractors))
    constants = letters[:num_constants]
    free = iter(letters[num_constants:])
    digits = rng.sample(string.digits, num_constants)
    value = dict(zip(constants, digits))

    query_root = rng.choice(constants)
    other_roots = [c for c in constants if c != query_root] or [query_root]
    roots = [query_root] + [rng.choice(other_roots) for _ in range(num_distractors)]
    chains: list[list[tuple[str, str]]] = []
    ends: list[str] = []
    for root in roots:
        names = [root, *itertools.islice(free, depth)]  # each variable is assigned the one before it
        chains.append(list(zip(names[1:], names)))
        ends.append(names[-1])

    const_lines = [(c, value[c]) for c in constants]
    rng.shuffle(const_lines)
    assignments = const_lines + _interleave(rng, chains)
    query = ends[0]
    body = "\n".join(f"{lhs}={rhs}" for lhs, rhs in assignments)
    prompt = f"{HEADER}\n{body}\n{query}=___\nAnswer: |"
    answer = value[query_root]
    return {
        "prompt": prompt,
        "target": answer,
        "answer": answer,
        "query": query,
        "depth": depth,
        "assignments": [list(a) for a in assignments],
    }


def iter_variable_assignment(
    num_samples: int | None,
    depth: int = 5,
    num_constants: int = 3,
    num_distractors: int = 2,
    seed: int = 0,
    stream: str = "train",
    min_depth: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples one at a time (None: without end), deterministic in (seed, stream).

    Bad settings fail on the call. The first k samples are the same for any `num_samples` >= k, so
    a caller can show progress, or draw until it has enough, and get exactly what
    `generate_variable_assignment` returns.
    """
    _validate(depth, num_constants, num_distractors, min_depth)
    return seeded_samples("variable-assignment", num_samples, seed, stream,
                          lambda rng: _make_sample(rng, depth, num_constants, num_distractors, min_depth))


def generate_variable_assignment(
    num_samples: int,
    depth: int = 5,
    num_constants: int = 3,
    num_distractors: int = 2,
    seed: int = 0,
    stream: str = "train",
    min_depth: int | None = None,
) -> list[dict[str, Any]]:
    """``num_samples`` samples, deterministic in (seed, stream); see the module docstring."""
    return list(iter_variable_assignment(num_samples, depth, num_constants, num_distractors, seed, stream, min_depth))


def solve_variable_assignment(prompt: str) -> str:
    """Answer a prompt by parsing it and following assignments (independent of the generator)."""
    table: dict[str, str] = {}
    query: str | None = None
    for line in prompt.splitlines():
        line = line.strip()
        if m := _QUERY.fullmatch(line):
            query = m.group(1)
        elif m := _LINE.fullmatch(line):
            table[m.group(1)] = m.group(2)
    if query is None:
        raise ValueError("prompt has no query line like 'z=___'")
    current, seen = query, set()
    while not current.isdigit():
        if current in seen:
            raise ValueError(f"assignment cycle through {current!r}")
        if current not in table:
            raise ValueError(f"variable {current!r} is never assigned")
        seen.add(current)
        current = table[current]
    return current
