"""Variable assignment: the solver (and an independent walk here) agrees with the answers."""

from __future__ import annotations

import re

import pytest

from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.variable_assignment import (
    HEADER,
    generate_variable_assignment,
    solve_variable_assignment,
)

PAPER_PROMPT = (
    "Variable assignment. Follow the assignments and fill in the blank.\n"
    "a=5\nb=2\nc=8\nx=c\ny=x\nz=y\nw=b\nv=w\nz=___\nAnswer: |"
)


def walk(assignments: list[list[str]], query: str) -> tuple[str, int]:
    """Digit reached from ``query`` and the number of variable-to-variable hops on the way."""
    table = dict(assignments)
    hops, current = 0, table[query]
    while not current.isdigit():
        current, hops = table[current], hops + 1
    return current, hops


def test_paper_example() -> None:
    assert solve_variable_assignment(PAPER_PROMPT) == "8"
    pairs = [line.split("=") for line in PAPER_PROMPT.split("\n")[1:-2]]
    assert walk(pairs, "z") == ("8", 3)  # the paper's example has depth 3


def test_generated_answers_agree_with_solver_and_walk() -> None:
    for s in generate_variable_assignment(200, depth=5, seed=0):
        assert solve_variable_assignment(s["prompt"]) == s["answer"] == s["target"]
        assert walk(s["assignments"], s["query"]) == (s["answer"], 5)


def test_depth_counts_variable_hops() -> None:
    # depth d: the query is d variable assignments away from its constant (paper example: 3)
    for depth in (1, 3, 5):
        for s in generate_variable_assignment(20, depth=depth, seed=1):
            table = dict(s["assignments"])
            chain, current = [], s["query"]
            while not current.isdigit():
                chain.append(current)
                current = table[current]
            assert len(chain) == depth + 1 and s["depth"] == depth


def test_min_depth_mixes_every_depth_and_solves_each() -> None:
    samples = generate_variable_assignment(300, depth=4, min_depth=0, seed=3)
    assert {s["depth"] for s in samples} == {0, 1, 2, 3, 4}
    for s in samples:
        assert walk(s["assignments"], s["query"]) == (s["answer"], s["depth"])
        assert len(s["assignments"]) == 3 + s["depth"] * 3  # constants + the query chain + 2 distractor chains
    with pytest.raises(ValueError, match="min_depth must be in 0..depth"):
        generate_variable_assignment(1, depth=2, min_depth=3)


def test_format_and_structure() -> None:
    for s in generate_variable_assignment(50, depth=5, num_constants=3, num_distractors=2, seed=2):
        lines = s["prompt"].split("\n")
        assert lines[0] == HEADER and lines[-2] == f"{s['query']}=___" and lines[-1] == "Answer: |"
        body = lines[1:-2]
        assert len(body) == 3 + 5 * 3
        assert all(re.fullmatch(r"[a-z]=[a-z0-9]", line) for line in body)
        lhs = [line[0] for line in body]
        assert len(set(lhs)) == len(lhs)  # nobody assigned twice
        digits = [line[2] for line in body if line[2].isdigit()]
        assert len(digits) == 3 == len(set(digits))
        defined: set[str] = set()
        for line in body:  # every variable is defined before it is used
            assert line[2].isdigit() or line[2] in defined
            defined.add(line[0])
        # distractor chains end in other digits, so the answer is not the only reachable one
        ends = {walk(s["assignments"], v)[0] for v in lhs}
        assert len(ends) >= 2


def test_determinism() -> None:
    assert generate_variable_assignment(5, seed=3) == generate_variable_assignment(5, seed=3)
    assert generate_variable_assignment(5, seed=3) != generate_variable_assignment(5, seed=4)


def test_bad_config_and_solver_errors() -> None:
    with pytest.raises(ValueError, match="26 letters"):
        generate_variable_assignment(1, depth=9, num_distractors=2)
    with pytest.raises(ValueError):
        generate_variable_assignment(1, num_constants=11)
    with pytest.raises(ValueError, match="query"):
        solve_variable_assignment("a=5\nAnswer: |")
    with pytest.raises(ValueError, match="never assigned"):
        solve_variable_assignment("a=b\na=___")
    with pytest.raises(ValueError, match="cycle"):
        solve_variable_assignment("a=b\nb=a\na=___")


def test_jsonl(tmp_path) -> None:
    samples = generate_variable_assignment(3, seed=0)
    write_jsonl(samples, tmp_path / "va.jsonl")
    assert read_jsonl(tmp_path / "va.jsonl") == samples
