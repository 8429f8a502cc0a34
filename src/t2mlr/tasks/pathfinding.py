"""Pathfinding: write the unique shortest path of a directed graph (the authors' release's pathfinding task).

Each sample is a directed graph given as its shuffled edges, a start and an end node; the answer is the one
shortest path from start to end, written ``A -> B -> C``. Generation (seeded ``random.Random``, the release's
construction, written anew here):

1. a backbone start → … → end of ``path_range`` edges (the release: 10-18);
2. ``lanes`` detours: each leaves the backbone in its first half, rejoins it in its second half and takes
   ``lane_extra`` more nodes than the stretch it bypasses, so every path through a lane is longer;
3. dead ends: every node that reaches the end (but the end) starts, with probability ``dead_end_prob``, a chain
   of ``dead_end_depth`` fresh nodes that reaches nothing.

A graph is kept only if the shortest path is unique (counted by BFS; the construction makes it so, the count
checks it). Node names are the release's kind: two (70%) or three consonant-vowel syllables and a closing
consonant, fresh per sample, or (``name_pool``) drawn from one fixed list of that many such names, so a small
word-level tokenizer can give each node one token (what a from-scratch CPU model needs).

Rows keep the release's field names, so its files and these are interchangeable: ``question`` (the prompt:
"Find the shortest path in this directed graph.", ``Start:``, ``End:``, ``Edges:`` one ``a -> b`` per line, then
``Answer: ``), ``response`` (the supervised reply: the answer, after ``"Wait "`` with ``wait_prefix``),
``answer`` (the path), ``edges`` (``[src, dst]`` pairs in the prompt's order), ``start``, ``end`` and ``meta``
(``num_nodes``, ``shortest_length``, ``num_shortest_paths``, ``backbone_length``: the backbone's nodes).

Scoring (`score_path`): the reply's path (after an optional ``Wait`` and, as in the release's random-walk
variant, after the last ``|``) is right iff it starts at the start, ends at the end, every step is an edge of
the graph and it has the shortest length: any valid shortest path counts, not only the gold one. Rows read
from a file are checked by `check_row` (a path exists, exactly one is shortest, the edges are well formed,
the answer is that path) and refused with their file and line (`read_pathfinding_file`).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from t2mlr.tasks.jsonl import numbered_jsonl
from t2mlr.tasks.prosqa import CONSONANTS, VOWELS
from t2mlr.tasks.sampling import distinct_words, seeded_samples

__all__ = [
    "ARROW",
    "RELEASE_SPLITS",
    "check_row",
    "generate_pathfinding",
    "iter_pathfinding",
    "load_pathfinding_data",
    "parse_path",
    "read_pathfinding_file",
    "score_path",
    "shortest_paths",
]

ARROW = " -> "
HEADER = "Find the shortest path in this directed graph.\n"
FIELDS = ("question", "response", "answer", "edges", "start", "end", "meta")
_CLOSING = "xnrstlmv"  # a name's last letter
_MAX_DRAWS = 50  # graphs drawn per kept sample before a setting is declared unable to give a unique path
# A data directory's splits: this library's names, then the release's (`make_pathfinding_dataset.py`)
RELEASE_SPLITS = {"train": ("train.jsonl", "pathfinding_train.json"),
                  "test": ("test.jsonl", "eval.jsonl", "pathfinding_test.json")}


# ---------------------------------------------------------------------------------------------- graphs


def shortest_paths(edges: Sequence[Sequence[str]], start: str, end: str) -> tuple[int | None, int]:
    """(edges on a shortest start → end path, how many shortest paths there are); (None, 0) when none exists."""
    children: dict[str, list[str]] = {}
    for src, dst in edges:
        children.setdefault(src, []).append(dst)
    distance, ways = {start: 0}, {start: 1}
    queue = deque([start])
    while queue:  # BFS visits nodes by distance, so a node's count is final before it is dequeued
        node = queue.popleft()
        for child in children.get(node, ()):
            if child not in distance:
                distance[child], ways[child] = distance[node] + 1, 0
                queue.append(child)
            if distance[child] == distance[node] + 1:
                ways[child] += ways[node]
    return (distance[end], ways[end]) if end in distance else (None, 0)


def _graph(rng: random.Random, path_len: int, lanes: int, lane_extra: tuple[int, int], dead_end_prob: float,
           dead_end_depth: int) -> tuple[list[tuple[int, int]], int]:
    """Edges over node ids (0 the start, `path_len` the end) and the number of nodes."""
    edges = [(i, i + 1) for i in range(path_len)]
    size = path_len + 1
    for _ in range(lanes):
        leave, rejoin = rng.randint(0, path_len // 2), rng.randint(path_len // 2 + 1, path_len - 1)
        nodes = list(range(size, size + rejoin - leave + rng.randint(*lane_extra)))
        size += len(nodes)
        chain = [leave, *nodes, rejoin]
        edges += list(zip(chain, chain[1:]))
    reaching_end = [n for n in range(size) if n != path_len]  # every node so far leads to the end
    for node in reaching_end:
        if rng.random() < dead_end_prob:
            chain = [node, *range(size, size + dead_end_depth)]
            size += dead_end_depth
            edges += list(zip(chain, chain[1:]))
    return edges, size


def _fresh_name(rng: random.Random) -> str:
    syllables = 2 if rng.random() < 0.7 else 3
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(_CLOSING)




def _name_pool(size: int) -> list[str]:
    """The fixed list of `size` node names (`name_pool`): one seed for every call, so the training and
    evaluation streams draw from the same words."""
    return distinct_words(random.Random(f"pathfinding-name-pool-{size}"), size, _fresh_name)


def most_nodes(path_range: tuple[int, int], lanes: int, lane_extra: tuple[int, int], dead_end_depth: int) -> int:
    """The most nodes a graph of these settings can have (a name pool must name them all)."""
    longest = path_range[1]
    reaching = longest + 1 + lanes * (longest - 1 + lane_extra[1])
    return reaching + (reaching - 1) * dead_end_depth


def _make_sample(rng: random.Random, path_range: tuple[int, int], lanes: int, lane_extra: tuple[int, int],
                 dead_end_prob: float, dead_end_depth: int, wait_prefix: bool, pool: list[str] | None
                 ) -> dict[str, Any]:
    for _ in range(_MAX_DRAWS):
        path_len = rng.randint(*path_range)
        edges, size = _graph(rng, path_len, lanes, lane_extra, dead_end_prob, dead_end_depth)
        length, count = shortest_paths(edges, 0, path_len)
        if count == 1:
            break
    else:
        raise ValueError(f"no graph with a unique shortest path in {_MAX_DRAWS} draws: the settings cannot give one")
    names = distinct_words(rng, size, _fresh_name) if pool is None else rng.sample(pool, size)
    named = [[names[a], names[b]] for a, b in edges]
    rng.shuffle(named)
    start, end = names[0], names[path_len]
    answer = ARROW.join(names[i] for i in range(path_len + 1))
    question = (HEADER + f"Start: {start}\nEnd: {end}\nEdges:\n" + "\n".join(ARROW.join(e) for e in named)
                + "\nAnswer: ")
    return {"question": question, "response": ("Wait " if wait_prefix else "") + answer, "answer": answer,
            "edges": named, "start": start, "end": end,
            "meta": {"num_nodes": size, "shortest_length": length, "num_shortest_paths": count,
                     "backbone_length": path_len + 1}}


def _validate(path_range: tuple[int, int], lanes: int, lane_extra: tuple[int, int], dead_end_prob: float,
              dead_end_depth: int, name_pool: int | None) -> None:
    """Settings a graph can be built from; a name pool large enough for the largest graph."""
    if not 3 <= path_range[0] <= path_range[1]:  # a lane leaves in the first half and rejoins in the second
        raise ValueError(f"path_range must satisfy 3 <= lo <= hi, got {list(path_range)}")
    if lanes < 0 or dead_end_depth < 1 or not 0.0 <= dead_end_prob <= 1.0:
        raise ValueError(f"need lanes >= 0, dead_end_depth >= 1 and 0 <= dead_end_prob <= 1, got {lanes}, "
                         f"{dead_end_depth}, {dead_end_prob}")
    if not 1 <= lane_extra[0] <= lane_extra[1]:
        raise ValueError(f"lane_extra must satisfy 1 <= lo <= hi (a detour longer than the backbone), got "
                         f"{list(lane_extra)}")
    needed = most_nodes(path_range, lanes, lane_extra, dead_end_depth)
    if name_pool is not None and name_pool < needed:
        raise ValueError(f"name_pool {name_pool} is smaller than the largest graph these settings give "
                         f"({needed} nodes)")


def iter_pathfinding(
    num_samples: int | None,
    path_range: tuple[int, int] = (10, 18),
    lanes: int = 6,
    lane_extra: tuple[int, int] = (1, 3),
    dead_end_prob: float = 0.2,
    dead_end_depth: int = 2,
    wait_prefix: bool = False,
    name_pool: int | None = None,
    seed: int = 0,
    stream: str = "train",
) -> Iterator[dict[str, Any]]:
    """Pathfinding rows one at a time (None: without end), deterministic in (seed, stream); the defaults are the
    release's. Bad settings fail on the call; the first k rows are the same for any `num_samples` >= k."""
    path_range, lane_extra = tuple(path_range), tuple(lane_extra)
    _validate(path_range, lanes, lane_extra, dead_end_prob, dead_end_depth, name_pool)
    pool = None if name_pool is None else _name_pool(name_pool)
    return seeded_samples("pathfinding", num_samples, seed, stream,
                          lambda rng: _make_sample(rng, path_range, lanes, lane_extra, dead_end_prob, dead_end_depth,
                                                   wait_prefix, pool))


def generate_pathfinding(num_samples: int, seed: int = 0, stream: str = "train",
                         **settings: Any) -> list[dict[str, Any]]:
    """`num_samples` pathfinding rows, deterministic in (seed, stream); `settings` as `iter_pathfinding` takes them."""
    return list(iter_pathfinding(num_samples, seed=seed, stream=stream, **settings))


# ---------------------------------------------------------------------------------------------- scoring


def parse_path(text: str) -> list[str] | None:
    """The node names of the path a reply writes (its first line; after the last ``|`` and an optional
    leading ``Wait``), or None when the line is not ``A -> B -> ...`` with one word per node."""
    line = text.strip().split("\n", 1)[0].rsplit("|", 1)[-1].strip()
    line = line.removeprefix("Wait").strip()
    nodes = [part.strip() for part in line.split("->")]
    if not line or any(not node or len(node.split()) != 1 for node in nodes):
        return None
    return nodes


def score_path(row: Mapping[str, Any], text: str) -> tuple[list[str] | None, bool]:
    """The path a reply writes and whether it is a shortest path of the row's graph from its start to its end
    (any shortest path, not only the gold one)."""
    nodes = parse_path(text)
    if nodes is None or nodes[0] != row["start"] or nodes[-1] != row["end"]:
        return nodes, False
    edges = {(src, dst) for src, dst in row["edges"]}
    length, _ = shortest_paths(row["edges"], row["start"], row["end"])
    steps = list(zip(nodes, nodes[1:]))
    return nodes, length == len(steps) and all(step in edges for step in steps)


# ---------------------------------------------------------------------------------------------- files


def check_row(row: Mapping[str, Any]) -> None:
    """Refuse a row this task cannot train or score on (a ValueError saying why): missing fields, malformed
    edges, no path from start to end, several shortest paths, or an answer that is not the shortest path."""
    missing = [key for key in ("question", "answer", "edges", "start", "end") if key not in row]
    if missing:
        raise ValueError(f"missing field(s) {missing} (a pathfinding row has {', '.join(FIELDS)})")
    edges = row["edges"]
    if not isinstance(edges, list) or not edges:
        raise ValueError("edges must be a non-empty list of [src, dst] pairs")
    for i, edge in enumerate(edges):
        if (not isinstance(edge, (list, tuple)) or len(edge) != 2
                or not all(isinstance(n, str) and n and len(n.split()) == 1 and "->" not in n for n in edge)):
            raise ValueError(f"edges[{i}] is {edge!r}: each edge must be [src, dst], two node names without spaces")
    start, end = row["start"], row["end"]
    length, count = shortest_paths(edges, start, end)
    if length is None:
        raise ValueError(f"the graph has no path from start {start!r} to end {end!r}")
    if count != 1:
        raise ValueError(f"the graph has {count} shortest paths from {start!r} to {end!r} (of {length} edges); the "
                         "task needs exactly one")
    if not score_path(row, str(row["answer"]))[1]:
        raise ValueError(f"answer {row['answer']!r} is not the shortest path ({length} edges) from {start!r} "
                         f"to {end!r}")


def read_pathfinding_file(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a pathfinding file, each checked by `check_row`: JSON lines (an error names file:line) or,
    as the release writes them, one JSON list (file:item N)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pathfinding data file not found: {path}")
    if path.suffix == ".json":
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from err
        if not isinstance(items, list):
            raise ValueError(f"{path}: a .json pathfinding file is one JSON list of rows")
        located = [(f"{path}: item {i}", item) for i, item in enumerate(items)]
    else:
        located = [(f"{path}:{number}", row) for number, row in numbered_jsonl(path)]
    rows = []
    for where, row in located:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        try:
            check_row(row)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _split(directory: Path, split: str) -> Path:
    for name in RELEASE_SPLITS[split]:
        if (directory / name).is_file():
            return directory / name
    raise ValueError(f"data directory {directory} has no {split} split: one of {', '.join(RELEASE_SPLITS[split])}")


def load_pathfinding_data(data: str | Path, eval_size: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out rows of a local file (its last `eval_size` rows held out) or directory (train and
    test splits: `train.jsonl` / `test.jsonl`, or the release's `pathfinding_train.json` / `pathfinding_test.json`),
    every row checked."""
    path = Path(data)
    if path.is_dir():
        return read_pathfinding_file(_split(path, "train")), read_pathfinding_file(_split(path, "test"))
    rows = read_pathfinding_file(path)
    if len(rows) <= eval_size:
        raise ValueError(f"{path} has {len(rows)} rows: too few to hold out {eval_size} for evaluation")
    return rows[:-eval_size], rows[-eval_size:]
