"""S5 group and S5-Retrieval generator, checked against references written here.

The reference for composition is permutation matrices (P[i, j] = 1 iff p(j) = i), so that
p∘q (q applied first) is the matrix product P·Q: an algebraic route independent of the
index arithmetic in ``t2mlr.tasks.s5``.
"""

from __future__ import annotations

import itertools
import random

import pytest

from t2mlr.tasks import s5
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.s5_retrieval import (
    BLANK,
    DELIMITER,
    generate_s5_eval,
    generate_s5_retrieval,
    iter_s5_retrieval,
    s5_targets_from_input,
)

# ---------- independent references ----------

def matrix(p: tuple[int, ...]) -> list[list[int]]:
    m = [[0] * 5 for _ in range(5)]
    for j, image in enumerate(p):
        m[image - 1][j] = 1
    return m


def matmul(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    return [[sum(a[i][t] * b[t][j] for t in range(5)) for j in range(5)] for i in range(5)]


def from_matrix(m: list[list[int]]) -> tuple[int, ...]:
    return tuple(next(i + 1 for i in range(5) if m[i][j]) for j in range(5))


def ref_compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    return from_matrix(matmul(matrix(p), matrix(q)))


def tok(p: str) -> str:
    return f"<A_{p}>"


def ref_targets(input_tokens: list[str]) -> list[str]:
    """Recompute targets from an input with the matrix reference, not the module's code."""
    d = input_tokens.index("|")
    table: dict[str, list[str]] = {}
    i = 0
    while i < d:
        j = i + 1
        while j < d and not input_tokens[j].startswith("<A_"):
            j += 1
        table[input_tokens[i]] = input_tokens[i + 1 : j]
        i = j
    k = len(next(iter(table.values())))
    out = list(input_tokens[: d + 1])
    state = matrix((1, 2, 3, 4, 5))
    for a in input_tokens[d + 1 :: k + 1]:
        state = matmul(state, matrix(tuple(int(c) for c in a[3:8])))
        name = tok("".join(map(str, from_matrix(state))))
        out += [name] + table[name]
    return out


# ---------- the group ----------

def test_elements_are_all_120_in_lexicographic_order() -> None:
    assert len(s5.ELEMENTS) == 120 == len(set(s5.ELEMENTS))
    assert list(s5.ELEMENTS) == sorted(s5.ELEMENTS)
    assert s5.ELEMENTS[0] == s5.IDENTITY == (1, 2, 3, 4, 5)
    assert s5.ELEMENTS[-1] == (5, 4, 3, 2, 1)
    assert all(s5.index_of(p) == i for i, p in enumerate(s5.ELEMENTS))


def test_compose_matches_matrix_reference_on_all_pairs() -> None:
    for p, q in itertools.product(s5.ELEMENTS, repeat=2):
        assert s5.compose(p, q) == ref_compose(p, q)


def test_compose_convention_hand_computed() -> None:
    swap12, swap23 = (2, 1, 3, 4, 5), (1, 3, 2, 4, 5)
    # q = swap23 first: 1→1→2, 2→3→3, 3→2→1
    assert s5.compose(swap12, swap23) == (2, 3, 1, 4, 5)
    assert s5.compose(swap23, swap12) == (3, 1, 2, 4, 5)


def test_paper_table_example_states() -> None:
    actions = [(5, 4, 2, 1, 3), (4, 3, 1, 2, 5), (5, 2, 3, 1, 4)]
    assert s5.running_products(actions) == [(5, 4, 2, 1, 3), (1, 2, 5, 4, 3), (3, 2, 5, 1, 4)]


def test_identity_inverse_associativity() -> None:
    rng = random.Random(0)
    for p in s5.ELEMENTS:
        assert s5.compose(p, s5.IDENTITY) == p == s5.compose(s5.IDENTITY, p)
        inv = s5.inverse(p)
        assert s5.compose(p, inv) == s5.IDENTITY == s5.compose(inv, p)
        assert matmul(matrix(p), matrix(inv)) == matrix(s5.IDENTITY)
    for _ in range(200):
        p, q, r = (rng.choice(s5.ELEMENTS) for _ in range(3))
        assert s5.compose(s5.compose(p, q), r) == s5.compose(p, s5.compose(q, r))


def test_involution_count() -> None:
    # 10 transpositions + 15 double transpositions
    involutions = [p for p in s5.ELEMENTS if p != s5.IDENTITY and s5.compose(p, p) == s5.IDENTITY]
    assert len(involutions) == 25


def test_token_round_trip_and_errors() -> None:
    assert s5.perm_to_token((3, 2, 5, 1, 4)) == "<A_32514>"
    assert s5.token_to_perm("<A_32514>") == (3, 2, 5, 1, 4)
    assert all(s5.token_to_perm(t) == p for t, p in zip(s5.ALL_TOKENS, s5.ELEMENTS))
    assert not s5.is_perm_token("<A_11234>")
    for bad in ("<A_11234>", "<A_1234>", "A_12345", "<B_12345>"):
        with pytest.raises(ValueError):
            s5.token_to_perm(bad)
    with pytest.raises(ValueError):
        s5.compose((1, 1, 2, 3, 4), s5.IDENTITY)


# ---------- the generator ----------

def test_targets_recomputed_from_inputs_full_dictionary() -> None:
    samples = generate_s5_retrieval(12, n_range=(1, 32), seed=3)
    for s in samples:
        assert s["target_tokens"] == ref_targets(s["input_tokens"])
        assert s["target_tokens"] == s5_targets_from_input(s["input_tokens"])


def test_layout_and_score_mask() -> None:
    k = 3
    for s in generate_s5_retrieval(20, n_range=(1, 10), k=k, dict_size=16, seed=1):
        n, d = s["n"], s["delim_index"]
        inp, tgt = s["input_tokens"], s["target_tokens"]
        assert len(inp) == len(tgt) == 16 * (k + 1) + 1 + n * (k + 1)
        assert d == 16 * (k + 1) and inp[d] == tgt[d] == DELIMITER
        assert s["score_start"] == d + 1
        assert s["score_mask"] == [0] * (d + 1) + [1] * (n * (k + 1))
        assert tgt[: d + 1] == inp[: d + 1]  # copied, unscored
        keys = inp[0:d:k + 1]
        assert len(set(keys)) == 16 and all(s5.is_perm_token(x) for x in keys)
        actions = inp[d + 1 :: k + 1]
        assert len(actions) == n
        assert all(inp[d + 1 + i * (k + 1) + j] == BLANK for i in range(n) for j in range(1, k + 1))
        states = tgt[d + 1 :: k + 1]
        assert set(states) <= set(keys)  # every visited state is retrievable
        assert s["target_tokens"] == ref_targets(inp)


def test_default_dictionary_has_all_120_keys() -> None:
    s = generate_s5_retrieval(1, seed=5)[0]
    keys = s["input_tokens"][0 : s["delim_index"] : 5]
    assert sorted(keys) == sorted(s5.ALL_TOKENS)


def test_retrieves_value_of_state_not_of_action() -> None:
    # Hand-built input where D(a_2) and D(a_1∘a_2) differ.
    a1, a2 = "54213", "43125"  # a1∘a2 = 12543 (paper table)
    dict_part = [tok(a1), "J", "c", tok(a2), "X", "X", tok("12543"), "9", "O"]
    inp = dict_part + ["|", tok(a1), BLANK, BLANK, tok(a2), BLANK, BLANK]
    expected = dict_part + ["|", tok(a1), "J", "c", tok("12543"), "9", "O"]
    assert s5_targets_from_input(inp) == expected == ref_targets(inp)
    # In generated data, some position must have D(action) != D(state), and targets use D(state).
    differs = 0
    for s in generate_s5_retrieval(10, n_range=(4, 8), seed=11):
        inp, tgt, d = s["input_tokens"], s["target_tokens"], s["delim_index"]
        table = {inp[i]: inp[i + 1 : i + 5] for i in range(0, d, 5)}
        for pos in range(d + 1, len(inp), 5):
            assert tgt[pos + 1 : pos + 5] == table[tgt[pos]]
            differs += table[inp[pos]] != table[tgt[pos]]
    assert differs > 0


def test_paper_table_sample_targets() -> None:
    inp = ("<A_32514> F 4 N d <A_12543> 9 O 8 W <A_54213> J c c q | "
           "<A_54213> _ _ _ _ <A_43125> _ _ _ _ <A_52314> _ _ _ _").split()
    tgt = ("<A_32514> F 4 N d <A_12543> 9 O 8 W <A_54213> J c c q | "
           "<A_54213> J c c q <A_12543> 9 O 8 W <A_32514> F 4 N d").split()
    assert s5_targets_from_input(inp) == tgt


def test_determinism_and_streams() -> None:
    a = generate_s5_retrieval(5, n_range=(1, 8), dict_size=8, seed=7)
    b = generate_s5_retrieval(5, n_range=(1, 8), dict_size=8, seed=7)
    c = generate_s5_retrieval(5, n_range=(1, 8), dict_size=8, seed=8)
    d = generate_s5_retrieval(5, n_range=(1, 8), dict_size=8, seed=7, stream="eval")
    assert a == b
    assert a != c and a != d


def test_n_is_uniform_over_range_and_eval_per_n() -> None:
    ns = [s["n"] for s in generate_s5_retrieval(200, n_range=(2, 5), dict_size=8, seed=0)]
    assert set(ns) == {2, 3, 4, 5}
    ev = generate_s5_eval(3, n_range=(1, 4), dict_size=4, seed=0)
    assert [s["n"] for s in ev] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert all(s["target_tokens"] == ref_targets(s["input_tokens"]) for s in ev)


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError, match="dict_size"):
        generate_s5_retrieval(1, n_range=(1, 32), dict_size=16)
    with pytest.raises(ValueError):
        generate_s5_retrieval(1, n_range=(0, 3))
    with pytest.raises(ValueError):
        generate_s5_retrieval(1, k=0)
    with pytest.raises(ValueError):
        generate_s5_retrieval(1, alphabet="ab|")
    with pytest.raises(ValueError):
        generate_s5_retrieval(1, alphabet="aa")
    with pytest.raises(ValueError):  # fails on the call, before any sample is drawn
        iter_s5_retrieval(1, n_range=(1, 32), dict_size=16)
    with pytest.raises(ValueError):
        generate_s5_eval(1, n_range=(5, 1))


def test_recompute_rejects_malformed_input() -> None:
    good = [tok("12345"), "a", "|", tok("12345"), BLANK]
    assert s5_targets_from_input(good)[-2:] == [tok("12345"), "a"]
    with pytest.raises(ValueError, match="delimiter"):
        s5_targets_from_input([tok("12345"), "a", tok("12345"), BLANK])
    with pytest.raises(ValueError, match="not in the dictionary"):
        s5_targets_from_input([tok("12345"), "a", "|", tok("21345"), BLANK])
    with pytest.raises(ValueError, match="blanks"):
        s5_targets_from_input([tok("12345"), "a", "|", tok("12345"), "x"])


def test_jsonl_round_trip(tmp_path) -> None:
    samples = generate_s5_retrieval(4, n_range=(1, 4), dict_size=4, seed=2)
    path = tmp_path / "sub" / "s5.jsonl"
    assert write_jsonl(samples, path) == 4
    assert read_jsonl(path) == samples
