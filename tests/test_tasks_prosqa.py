"""ProsQA-Hard: graph invariants checked independently, and the path checker."""

from __future__ import annotations

from collections import defaultdict, deque
from statistics import mean

import pytest

from t2mlr.tasks.prosqa import check_answer, check_path, generate_prosqa_hard


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return generate_prosqa_hard(30, seed=0)


def bfs(edges: list[list[str]], source: str) -> dict[str, int]:
    children: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        children[a].append(b)
    dist, queue = {source: 0}, deque([source])
    while queue:
        u = queue.popleft()
        for w in children[u]:
            if w not in dist:
                dist[w] = dist[u] + 1
                queue.append(w)
    return dist


def is_acyclic(edges: list[list[str]]) -> bool:
    indeg: dict[str, int] = defaultdict(int)
    children: dict[str, list[str]] = defaultdict(list)
    nodes = {x for e in edges for x in e}
    for a, b in edges:
        children[a].append(b)
        indeg[b] += 1
    ready = [n for n in nodes if indeg[n] == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for w in children[u]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return seen == len(nodes)


def test_graph_invariants(samples: list[dict]) -> None:
    for s in samples:
        edges = s["edges"]
        assert is_acyclic(edges)
        dist = bfs(edges, s["root"])
        assert s["wrong"] not in dist
        assert dist[s["correct"]] == s["path_len"] == len(s["steps"]) - 1
        assert not any(a in (s["correct"], s["wrong"]) for a, _ in edges)
        assert len({x for e in edges for x in e}) == s["num_nodes"]
        assert s["question"].count("Every ") == len(edges)
    assert 55 <= mean(s["num_nodes"] for s in samples) <= 65
    assert 7 <= mean(s["path_len"] for s in samples) <= 9


def test_text_format(samples: list[dict]) -> None:
    s = samples[0]
    e, root = s["entity"], s["root"]
    assert s["steps"][0] == f"{e} is a {root}."
    assert s["answer"] == f"{e} is a {s['correct']}."
    assert s["question"].endswith(
        (f"Is {e} a {s['correct']} or a {s['wrong']}?", f"Is {e} a {s['wrong']} or a {s['correct']}?")
    )
    assert f"{e} is a {root}." in s["question"]
    assert s["prompt"] == s["question"] + "\n"
    assert s["target"] == "\n".join(s["steps"]) + "\n### " + s["answer"]
    for a, b in s["edges"]:
        assert f"Every {a} is a {b}." in s["question"]


def test_checker_accepts_gold(samples: list[dict]) -> None:
    for s in samples:
        assert check_path(s, "\n".join(s["steps"]))
        assert check_path(s, s["target"])
        assert check_path(s, " ".join(s["steps"][1:]))  # entity line optional
        assert check_path(s, "\n".join(s["steps"]) + f"\n{s['answer']}")  # closing conclusion
        assert check_answer(s, s["target"])


def test_checker_rejects_broken_edge(samples: list[dict]) -> None:
    s = samples[0]
    steps = list(s["steps"])
    edges = {tuple(e) for e in s["edges"]}
    a = steps[3].split()[1]
    fake = next(b for _, b in s["edges"] if (a, b) not in edges and b != a)
    steps[3] = f"Every {a} is a {fake}."
    assert not check_path(s, "\n".join(steps))
    # a consistent chain that uses a fact absent from the question: a shortcut to the answer
    assert (s["root"], s["correct"]) not in edges
    assert not check_path(s, f"{s['steps'][0]}\nEvery {s['root']} is a {s['correct']}.")
    # skipping a step breaks the chain too
    assert not check_path(s, "\n".join(s["steps"][:2] + s["steps"][3:]))


def test_checker_rejects_wrong_end_and_start(samples: list[dict]) -> None:
    s = samples[0]
    assert not check_path(s, "\n".join(s["steps"][:-1]))  # stops early
    assert not check_path(s, f"{s['entity']} is a {s['wrong']}.\n" + "\n".join(s["steps"][1:]))
    assert not check_path(s, "")
    assert not check_path(s, s["steps"][0] + "\nI think so.\n" + "\n".join(s["steps"][1:]))
    assert not check_answer(s, f"### {s['entity']} is a {s['wrong']}.")


def test_checker_accepts_other_valid_path() -> None:
    sample = {
        "entity": "Tom", "root": "r", "correct": "c", "wrong": "w",
        "edges": [["r", "a"], ["a", "c"], ["r", "b"], ["b", "c"], ["x", "w"]],
    }
    assert check_path(sample, "Tom is a r. Every r is a b. Every b is a c.")
    assert not check_path(sample, "Tom is a r. Every r is a b. Every a is a c.")
    assert not check_path(sample, "Tom is a r. Every r is a c.")  # no such fact
    assert not check_path(sample, "Tom is a x. Every x is a w.")


def test_determinism() -> None:
    a = generate_prosqa_hard(3, seed=5)
    assert a == generate_prosqa_hard(3, seed=5)
    assert a != generate_prosqa_hard(3, seed=6)


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        generate_prosqa_hard(1, nodes_range=(10, 10), path_range=(8, 8))
    with pytest.raises(ValueError):
        generate_prosqa_hard(1, path_range=(0, 3))


def test_name_pool_draws_every_concept_from_one_fixed_list() -> None:
    settings = dict(nodes_range=(7, 8), path_range=(2, 2), edge_factor=1.2, name_pool=20)
    train = generate_prosqa_hard(40, seed=0, stream="train", **settings)
    held_out = generate_prosqa_hard(40, seed=3, stream="eval", **settings)
    names = lambda rows: {x for r in rows for e in r["edges"] for x in e}
    assert len(names(train)) <= 20 and len(names(held_out)) <= 20
    assert len(names(train) | names(held_out)) <= 20  # one list for every seed and stream
    assert len(names(generate_prosqa_hard(40, seed=0, nodes_range=(7, 8), path_range=(2, 2), edge_factor=1.2))) > 20
    for s in train:  # the graph invariants hold with pooled names too
        dist = bfs(s["edges"], s["root"])
        assert s["wrong"] not in dist and dist[s["correct"]] == s["path_len"]
        assert check_path(s, "\n".join(s["steps"]))
    with pytest.raises(ValueError, match="name_pool 6 is smaller"):
        generate_prosqa_hard(1, nodes_range=(7, 8), path_range=(2, 2), name_pool=6)
