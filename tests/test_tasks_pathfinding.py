"""Pathfinding: every generated evaluation row checked against a BFS and a path enumeration written here, the
scorer against the same reference on right, longer and broken replies, and bad rows refused with file:line."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest
from test_tasks_prosqa import bfs

from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.pathfinding import (
    check_row,
    generate_pathfinding,
    iter_pathfinding,
    load_pathfinding_data,
    read_pathfinding_file,
    score_path,
)
from t2mlr.training.config import load_sections


def preset_settings(preset: str) -> tuple[dict, int]:
    from t2mlr.experiments.sections import PathfindingTask, preset_config

    _, sections = load_sections(preset_config("pathfinding", preset), [], {"task": PathfindingTask})
    return sections["task"].settings, sections["task"].eval_size


# ---------------------------------------------------------------------------------------------- the reference


def children_of(edges: list[list[str]]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        children[a].append(b)
    return children


def bfs_distance(edges: list[list[str]], start: str, end: str) -> int | None:
    return bfs(edges, start).get(end)  # the ProsQA tests' BFS: edge counts from start


def paths_of_length(edges: list[list[str]], start: str, end: str, length: int) -> list[list[str]]:
    """Every walk of exactly `length` edges from start to end (at the shortest length these are the shortest
    paths), by depth-first enumeration: a count that shares nothing with BFS's."""
    children, found = children_of(edges), []

    def walk(path: list[str]) -> None:
        if len(path) == length + 1:
            if path[-1] == end:
                found.append(path)
            return
        for child in children[path[-1]]:
            walk([*path, child])

    walk([start])
    return found


def is_shortest_path(row: dict, nodes: list[str]) -> bool:
    edges = {tuple(e) for e in row["edges"]}
    return (nodes[0] == row["start"] and nodes[-1] == row["end"]
            and all(step in edges for step in zip(nodes, nodes[1:]))
            and len(nodes) - 1 == bfs_distance(row["edges"], row["start"], row["end"]))


# ---------------------------------------------------------------------------------------------- generated rows


@pytest.fixture(scope="module", params=["paper", "cpu", "tiny"])
def eval_rows(request) -> list[dict]:
    """Every evaluation row a preset generates (seed 0; the paper preset's first 200 of its 1,000)."""
    settings, size = preset_settings(request.param)
    return generate_pathfinding(min(size, 200), seed=0, stream="eval", **settings)


def test_every_evaluation_row_has_one_shortest_path_and_it_is_the_answer(eval_rows) -> None:
    for row in eval_rows:
        assert set(row) == {"question", "response", "answer", "edges", "start", "end", "meta"}
        length = bfs_distance(row["edges"], row["start"], row["end"])
        shortest = paths_of_length(row["edges"], row["start"], row["end"], length)
        assert len(shortest) == 1 and " -> ".join(shortest[0]) == row["answer"] == row["response"]
        assert row["meta"]["shortest_length"] == length == row["meta"]["backbone_length"] - 1
        assert row["meta"]["num_shortest_paths"] == 1
        assert row["meta"]["num_nodes"] == len({n for e in row["edges"] for n in e})
        lines = row["question"].split("\n")
        assert lines[:4] == ["Find the shortest path in this directed graph.", f"Start: {row['start']}",
                             f"End: {row['end']}", "Edges:"]
        assert lines[4:-1] == [f"{a} -> {b}" for a, b in row["edges"]] and lines[-1] == "Answer: "


def test_the_release_settings_give_its_graphs() -> None:
    """10-18-edge backbones, 6 lanes that are longer than the stretch they bypass, dead ends that reach nothing."""
    rows = generate_pathfinding(100, seed=3, stream="eval")
    assert {r["meta"]["shortest_length"] for r in rows} <= set(range(10, 19))
    assert len({r["meta"]["shortest_length"] for r in rows}) > 5
    for row in rows:
        backbone = row["answer"].split(" -> ")
        children = children_of(row["edges"])
        leaves = {n for e in row["edges"] for n in e} - set(children)
        assert leaves - {row["end"]}, "no dead end at all in a release graph"
        assert all(bfs_distance(row["edges"], leaf, row["end"]) is None for leaf in leaves - {row["end"]})
        lanes = [c for node in backbone for c in children[node] if c not in backbone
                 and bfs_distance(row["edges"], c, row["end"]) is not None]
        assert len(lanes) == 6


def test_rows_are_seeded_per_stream_and_prefix_stable() -> None:
    settings, _ = preset_settings("cpu")
    first = generate_pathfinding(20, seed=1, stream="train", **settings)
    assert first == generate_pathfinding(20, seed=1, stream="train", **settings)
    assert first[:5] == list(iter_pathfinding(5, seed=1, stream="train", **settings))
    assert first != generate_pathfinding(20, seed=1, stream="eval", **settings)
    assert first != generate_pathfinding(20, seed=2, stream="train", **settings)
    names = {n for r in first for e in r["edges"] for n in e}
    assert len(names) <= settings["name_pool"]


@pytest.mark.parametrize("settings, said", [
    ({"path_range": (2, 4)}, "3 <= lo <= hi"),
    ({"lane_extra": (0, 2)}, "lane_extra"),
    ({"dead_end_prob": 1.5}, "dead_end_prob"),
    ({"path_range": (3, 4), "lanes": 2, "lane_extra": (1, 2), "dead_end_depth": 1, "name_pool": 28}, "29 nodes"),
])
def test_bad_settings_are_refused_on_the_call(settings, said) -> None:
    with pytest.raises(ValueError, match=said):
        iter_pathfinding(3, **settings)


# ---------------------------------------------------------------------------------------------- the scorer


def replies(row: dict, rng: random.Random) -> list[str]:
    """Replies to score: the answer as written and reworded, random walks from the start (valid paths, most of
    them longer), the answer with one node replaced or cut short, and junk."""
    gold = row["answer"].split(" -> ")
    children = children_of(row["edges"])
    out = [row["answer"], "Wait " + row["answer"], row["answer"] + "\nmore text", "x -> y | " + row["answer"],
           " -> ".join(gold[:-1]), " -> ".join(reversed(gold)), "", "no path here", row["answer"] + " ->"]
    for _ in range(6):
        walk = [row["start"]]
        while walk[-1] != row["end"] and children[walk[-1]] and len(walk) < 40:
            walk.append(rng.choice(children[walk[-1]]))
        out.append(" -> ".join(walk))
    for i in range(1, len(gold) - 1):
        out.append(" -> ".join([*gold[:i], rng.choice(sorted({n for e in row["edges"] for n in e})), *gold[i + 1:]]))
    return out


def reference_verdict(row: dict, text: str) -> bool:
    line = text.strip().split("\n")[0].split("|")[-1].strip()
    line = line[len("Wait"):].strip() if line.startswith("Wait") else line
    nodes = [n.strip() for n in line.split("->")]
    return bool(line) and all(n and " " not in n for n in nodes) and is_shortest_path(row, nodes)


def test_the_scorer_agrees_with_the_reference_on_every_evaluation_row(eval_rows) -> None:
    rng = random.Random(0)
    verdicts = []
    for row in eval_rows:
        for text in replies(row, rng):
            verdict = score_path(row, text)[1]
            assert verdict == reference_verdict(row, text), (row["answer"], text)
            verdicts.append(verdict)
    assert 0.05 < sum(verdicts) / len(verdicts) < 0.95  # both verdicts occur


def test_any_shortest_path_counts_not_only_the_gold_one() -> None:
    """A hand graph with two shortest paths (a-b-d, a-c-d) and a longer one (a-e-f-d)."""
    row = {"edges": [["a", "b"], ["b", "d"], ["a", "c"], ["c", "d"], ["a", "e"], ["e", "f"], ["f", "d"]],
           "start": "a", "end": "d", "answer": "a -> b -> d", "question": "(hand case)"}
    assert score_path(row, "a -> c -> d") == (["a", "c", "d"], True)
    assert score_path(row, "a -> b -> d")[1]
    assert not score_path(row, "a -> e -> f -> d")[1]  # valid, not shortest
    assert not score_path(row, "a -> d")[1]  # no such edge
    assert not score_path(row, "b -> d")[1]  # wrong start
    with pytest.raises(ValueError, match="2 shortest paths"):
        check_row(row)  # a row for this task must have exactly one


# ---------------------------------------------------------------------------------------------- files


def good_row() -> dict:
    return generate_pathfinding(1, seed=0, stream="eval", path_range=(3, 3), lanes=1, dead_end_prob=0.0)[0]


@pytest.mark.parametrize("change, said", [
    (lambda r: r.update(edges=[e for e in r["edges"] if e[1] != r["end"]]), "no path from start"),
    (lambda r: r["edges"].append([r["start"], r["answer"].split(" -> ")[-2]]), "is not the shortest path"),
    (lambda r: r["edges"].append([r["start"], r["answer"].split(" -> ")[2]]) or
     r["edges"].append([r["answer"].split(" -> ")[1], r["answer"].split(" -> ")[3]]), "2 shortest paths"),
    (lambda r: r["edges"].append(["a", "b", "c"]), r"edges\[\d+\]"),
    (lambda r: r["edges"].append(["a b", "c"]), r"edges\[\d+\]"),
    (lambda r: r.update(edges="a -> b"), "non-empty list"),
    (lambda r: r.pop("start"), "missing field"),
    (lambda r: r.update(answer=" -> ".join(r["answer"].split(" -> ")[:-1])), "is not the shortest path"),
])
def test_a_bad_row_is_refused_with_its_file_and_line(tmp_path, change, said) -> None:
    bad = good_row()
    change(bad)
    path = tmp_path / "rows.jsonl"
    write_jsonl([good_row(), good_row(), bad], path)
    with pytest.raises(ValueError, match=rf"{path}:3: .*{said}"):
        read_pathfinding_file(path)


def test_the_release_files_load_as_written(tmp_path) -> None:
    """A directory as the release's generator writes it (one JSON list per split, indented) loads, row for row."""
    settings, _ = preset_settings("tiny")
    train = generate_pathfinding(12, seed=0, stream="train", **settings)
    test = generate_pathfinding(4, seed=0, stream="eval", **settings)
    for name, rows in (("pathfinding_train.json", train), ("pathfinding_test.json", test)):
        (tmp_path / name).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    # the release writes edges as tuples, read back as lists: the same rows
    assert load_pathfinding_data(tmp_path, 4) == (train, test)
    bad = [*test[:2], {**test[2], "edges": [*test[2]["edges"], [test[2]["start"], test[2]["end"]]],
                       "answer": test[2]["answer"]}]
    (tmp_path / "pathfinding_test.json").write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="pathfinding_test.json: item 2: answer"):
        load_pathfinding_data(tmp_path, 4)


def test_a_single_file_holds_out_its_last_rows(tmp_path: Path) -> None:
    rows = [good_row() for _ in range(3)]
    write_jsonl(rows, tmp_path / "all.jsonl")
    assert load_pathfinding_data(tmp_path / "all.jsonl", 1) == (rows[:2], rows[2:])
    with pytest.raises(ValueError, match="too few to hold out 3"):
        load_pathfinding_data(tmp_path / "all.jsonl", 3)
