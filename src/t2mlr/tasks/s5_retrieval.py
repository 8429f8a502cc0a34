"""S5-Retrieval: state tracking over S5 composed with in-context dictionary retrieval (docs/semantics.md §7).

Every sequence has its own random dictionary ``D: S5 → Σ^K``. The input is the serialised
dictionary, the delimiter, then the actions ``a_1..a_N`` each followed by K blanks; the target
has the same length (a transduction: the target at position t is predicted *at* position t, not
at t+1). Layout, for K = 4 (``_`` is the blank)::

    input : <A_k1> c c c c  <A_k2> c c c c ... |  <A_a1> _ _ _ _   <A_a2> _ _ _ _ ...
    target: <A_k1> c c c c  <A_k2> c c c c ... |  <A_s1> D(s1)...  <A_s2> D(s2)... ...

with ``s_i = a_1 ∘ … ∘ a_i`` (see ``t2mlr.tasks.s5`` for the composition convention). The
retrieved value is D of the running **state**, not of the action (the authors' generator used
the action: a bug). The target over the dictionary and the delimiter is the input itself, and
it is not scored: only positions after the delimiter count (``score_start = delim_index + 1``).

Dictionary: all 120 keys by default. With ``dict_size < 120`` a random subset is used that
always contains every state the sample visits (so retrieval is always possible); since a
sample visits at most N distinct states, ``dict_size`` must be at least the largest N. The
key order is shuffled per sequence, so position alone never identifies a key. Values are K
characters drawn uniformly and independently from the alphabet (values may repeat).

JSONL schema (one object per line, as produced by ``generate_s5_retrieval``):

* ``input_tokens``  list[str]  the input symbols, length T = dict_size·(K+1) + 1 + N·(K+1)
* ``target_tokens`` list[str]  the aligned targets, length T
* ``n``             int        number of actions N
* ``k``             int        value length K
* ``dict_size``     int        number of dictionary entries serialised
* ``delim_index``   int        index of ``|`` in both token lists
* ``score_start``   int        ``delim_index + 1``: first scored position
* ``score_mask``    list[int]  length T, 1 at scored positions (t ≥ score_start), else 0
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

from t2mlr.tasks.s5 import (
    ELEMENTS,
    Perm,
    is_perm_token,
    perm_to_token,
    running_products,
    token_to_perm,
)
from t2mlr.tasks.sampling import seeded_samples

__all__ = [
    "BLANK",
    "DEFAULT_ALPHABET",
    "DELIMITER",
    "generate_s5_eval",
    "generate_s5_retrieval",
    "iter_s5_eval",
    "iter_s5_retrieval",
    "make_sample",
    "s5_targets_from_input",
]

DEFAULT_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
BLANK = "_"
DELIMITER = "|"
_RESERVED = set("<>" + BLANK + DELIMITER)


def validate_alphabet(alphabet: str) -> str:
    """Alphabet symbols must be distinct single characters that cannot clash with the layout."""
    if not alphabet:
        raise ValueError("alphabet must not be empty")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    bad = sorted(c for c in alphabet if c in _RESERVED or c.isspace())
    if bad:
        raise ValueError(f"alphabet may not contain whitespace or {sorted(_RESERVED)}: found {bad}")
    return alphabet


def _validate_config(n_range: tuple[int, int], k: int, dict_size: int) -> None:
    """Reject settings that would produce samples whose targets cannot be retrieved."""
    lo, hi = n_range
    if not (1 <= lo <= hi):
        raise ValueError(f"n_range must satisfy 1 <= lo <= hi, got {n_range}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not (1 <= dict_size <= len(ELEMENTS)):
        raise ValueError(f"dict_size must be in 1..{len(ELEMENTS)}, got {dict_size}")
    if dict_size < min(hi, len(ELEMENTS)):
        raise ValueError(
            f"dict_size={dict_size} is smaller than the largest N={hi}: a sample may visit up to N "
            "distinct states and every one must be in the dictionary"
        )


def _choose_keys(rng: random.Random, states: Sequence[Perm], dict_size: int) -> list[Perm]:
    """Every visited state plus random other keys up to ``dict_size``, in shuffled order."""
    needed = list(dict.fromkeys(states))
    if len(needed) > dict_size:
        raise ValueError(f"dict_size={dict_size} is smaller than the {len(needed)} states this sample visits")
    needed_set = set(needed)
    others = [p for p in ELEMENTS if p not in needed_set]
    keys = needed + rng.sample(others, dict_size - len(needed))
    rng.shuffle(keys)
    return keys


def make_sample(
    rng: random.Random, n: int, k: int, dict_size: int, alphabet: str, actions: Sequence[Perm] = ELEMENTS
) -> dict[str, Any]:
    """One sample with N = n actions drawn uniformly from ``actions`` (all of S5 by default, the paper's
    task; a generating set such as ``t2mlr.tasks.s5.generating_set`` for the CPU preset). All randomness
    comes from ``rng``."""
    if n < 1 or k < 1 or not actions:
        raise ValueError(f"need n >= 1, k >= 1 and a non-empty action set, got n={n}, k={k}")
    chosen = [rng.choice(actions) for _ in range(n)]
    states = running_products(chosen)
    keys = _choose_keys(rng, states, dict_size)
    values = {key: [rng.choice(alphabet) for _ in range(k)] for key in keys}

    # each key, action or state is its token followed by its K symbols (its value, or blanks)
    dict_part = [symbol for key in keys for symbol in (perm_to_token(key), *values[key])]
    action_part = [symbol for action in chosen for symbol in (perm_to_token(action), *[BLANK] * k)]
    state_part = [symbol for state in states for symbol in (perm_to_token(state), *values[state])]
    input_tokens = dict_part + [DELIMITER] + action_part
    target_tokens = dict_part + [DELIMITER] + state_part

    delim_index = len(dict_part)
    score_start = delim_index + 1
    return {
        "input_tokens": input_tokens,
        "target_tokens": target_tokens,
        "n": n,
        "k": k,
        "dict_size": dict_size,
        "delim_index": delim_index,
        "score_start": score_start,
        "score_mask": [0] * score_start + [1] * (len(input_tokens) - score_start),
    }


def iter_s5_retrieval(
    num_samples: int,
    n_range: tuple[int, int] = (1, 32),
    k: int = 4,
    dict_size: int = 120,
    seed: int = 0,
    alphabet: str = DEFAULT_ALPHABET,
    stream: str = "train",
) -> Iterator[dict[str, Any]]:
    """Lazily yield samples (N uniform in ``n_range``, inclusive) without holding them all.

    ``stream`` names an independent random stream for the same ``seed`` (e.g. "train" and
    "eval-n7"), so a train and an eval set generated with one seed do not share samples.
    """
    _validate_config(n_range, k, dict_size)
    validate_alphabet(alphabet)
    return seeded_samples("s5-retrieval", num_samples, seed, stream,
                          lambda rng: make_sample(rng, rng.randint(*n_range), k, dict_size, alphabet))


def generate_s5_retrieval(
    num_samples: int,
    n_range: tuple[int, int] = (1, 32),
    k: int = 4,
    dict_size: int = 120,
    seed: int = 0,
    alphabet: str = DEFAULT_ALPHABET,
    stream: str = "train",
) -> list[dict[str, Any]]:
    """``num_samples`` samples, deterministic in (seed, stream); see the module docstring."""
    return list(iter_s5_retrieval(num_samples, n_range, k, dict_size, seed, alphabet, stream))


def generate_s5_eval(
    size_per_n: int,
    n_range: tuple[int, int] = (1, 48),
    k: int = 4,
    dict_size: int = 120,
    seed: int = 0,
    alphabet: str = DEFAULT_ALPHABET,
) -> list[dict[str, Any]]:
    """``size_per_n`` samples for every N in ``n_range`` (ordered by N), for per-N reporting.

    Each N uses its own stream ``eval-n{N}``, independent of the training stream.
    """
    return list(iter_s5_eval(size_per_n, n_range, k, dict_size, seed, alphabet))


def iter_s5_eval(
    size_per_n: int,
    n_range: tuple[int, int] = (1, 48),
    k: int = 4,
    dict_size: int = 120,
    seed: int = 0,
    alphabet: str = DEFAULT_ALPHABET,
) -> Iterator[dict[str, Any]]:
    """The samples of ``generate_s5_eval`` one at a time, in the same order; bad settings fail on the call."""
    if size_per_n < 0:
        raise ValueError(f"size_per_n must be >= 0, got {size_per_n}")
    _validate_config(n_range, k, dict_size)
    validate_alphabet(alphabet)
    streams = (iter_s5_retrieval(size_per_n, (n, n), k, dict_size, seed, alphabet, f"eval-n{n}")
               for n in range(n_range[0], n_range[1] + 1))
    return itertools.chain.from_iterable(streams)


def _infer_k(dict_part: Sequence[str]) -> int:
    """K is the number of value symbols after the first key (the layout is key, K values, key…)."""
    if not dict_part or not is_perm_token(dict_part[0]):
        raise ValueError("input must start with a dictionary key token like <A_12345>")
    second_key = next((i for i in range(1, len(dict_part)) if is_perm_token(dict_part[i])), len(dict_part))
    return second_key - 1


def _parse_dictionary(dict_part: Sequence[str], k: int) -> dict[Perm, list[str]]:
    """Map each key to its K value symbols, checking the layout strictly."""
    if k < 1 or len(dict_part) % (k + 1) != 0:
        raise ValueError(f"dictionary part of length {len(dict_part)} is not a whole number of key+{k} entries")
    table: dict[Perm, list[str]] = {}
    for start in range(0, len(dict_part), k + 1):
        key = token_to_perm(dict_part[start])
        value = list(dict_part[start + 1 : start + 1 + k])
        if any(is_perm_token(v) or v in (BLANK, DELIMITER) for v in value):
            raise ValueError(f"malformed dictionary value for {dict_part[start]}: {value}")
        if key in table:
            raise ValueError(f"duplicate dictionary key {dict_part[start]}")
        table[key] = value
    return table


def _parse_actions(action_part: Sequence[str], k: int) -> list[Perm]:
    """Actions are key tokens each followed by exactly K blanks."""
    if len(action_part) % (k + 1) != 0:
        raise ValueError(f"action part of length {len(action_part)} is not a whole number of action+{k} blanks")
    actions: list[Perm] = []
    for start in range(0, len(action_part), k + 1):
        actions.append(token_to_perm(action_part[start]))
        blanks = action_part[start + 1 : start + 1 + k]
        if any(b != BLANK for b in blanks):
            raise ValueError(f"action {action_part[start]} must be followed by {k} blanks, got {list(blanks)}")
    return actions


def s5_targets_from_input(input_tokens: Sequence[str]) -> list[str]:
    """Recompute the full target sequence from an input sequence alone (independent check)."""
    if list(input_tokens).count(DELIMITER) != 1:
        raise ValueError(f"input must contain exactly one delimiter {DELIMITER!r}")
    delim = list(input_tokens).index(DELIMITER)
    dict_part, action_part = input_tokens[:delim], input_tokens[delim + 1 :]
    k = _infer_k(dict_part)
    table = _parse_dictionary(dict_part, k)
    targets = list(input_tokens[: delim + 1])
    for state in running_products(_parse_actions(action_part, k)):
        if state not in table:
            raise ValueError(f"state {perm_to_token(state)} is not in the dictionary")
        targets.append(perm_to_token(state))
        targets.extend(table[state])
    return targets
