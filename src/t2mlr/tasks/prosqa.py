"""ProsQA-Hard: logical reasoning over random concept DAGs (ProsQA of Coconut, scaled up).

Each sample is a DAG over made-up concept names (about 60 nodes), stated as "Every X is a Y."
facts. A person belongs to a root concept; the question asks which of two concepts the person
is. The correct option is reachable from the root along a gold path of about 8 edges; the
wrong option is not reachable from the root at all.

Generation (seeded ``random.Random``; node count uniform in ``nodes_range``, gold-path length,
counted in "Every" edges, uniform in ``path_range``):

1. the gold path root → … → correct option;
2. a separate chain of fresh concepts leading to the wrong option, and a second chain of fresh
   concepts leading into the correct option (so neither option is told apart by in-degree);
3. every remaining concept gets at least one edge, then random extra edges are added up to
   ``edge_factor × nodes``. An edge is kept only if the graph stays acyclic, the wrong option
   stays unreachable from the root, no path from the root to the correct option becomes shorter
   than the gold path, and both options stay sinks (no outgoing edges).

``name_pool`` (optional) draws every sample's concept names from one fixed list of that many names,
the same for every seed and stream, instead of fresh names per sample: with a pool, a small word-level
tokenizer can give each concept one token, which is what a from-scratch CPU-sized model needs (the
held-out problems still have their own graphs, just not new words).

Text format (Coconut's, as in the paper's data-example table): ``question`` is the shuffled
facts, then "Name is a Root.", then "Is Name a A or a B?" (option order random), all joined by
single spaces; ``steps`` is ["Name is a Root.", "Every Root is a C1.", …, "Every C_{L-1} is a
Correct."]; ``answer`` is "Name is a Correct.".

JSONL schema: ``question`` (str), ``steps`` (list[str]), ``answer`` (str), ``prompt`` (str:
question + "\\n"), ``target`` (str: the steps joined by "\\n", then "\\n### " + answer),
``entity``, ``root``, ``correct``, ``wrong`` (str), ``edges`` (list of ``[parent, child]``
concept pairs, i.e. "Every parent is a child."), ``num_nodes`` (int), ``path_len`` (int, gold
"Every" steps).
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from t2mlr.tasks.sampling import distinct_words, seeded_samples

__all__ = [
    "check_answer",
    "check_path",
    "generate_prosqa_hard",
    "iter_prosqa_hard",
]

_PEOPLE = (
    "Alex", "Jordan", "Sam", "Tom", "Sally", "Max", "Rex", "Polly", "Wren", "Fae", "Bob", "Jack",
    "Davis", "Stella", "Nina", "Omar", "Lena", "Ivan", "Mira", "Theo", "Ruby", "Hugo", "Iris",
    "Felix", "Gwen", "Otto", "Vera", "Leo", "Tara", "Eli",
)
CONSONANTS = "bcdfglmnprstvz"  # concept names are consonant-vowel syllables (build_task_tokenizer: one symbol each)
VOWELS = "aeiou"
_SUFFIXES = ("rus", "pus", "bus", "mus", "nus", "lus", "tus", "sus")
_EVERY = re.compile(r"Every ([a-z]+) is an? ([a-z]+)\.")
_MAX_EDGE_TRIES = 40


def _concept_name(rng: random.Random) -> str:
    """A pronounceable made-up word starting with a consonant (so "a X" reads well)."""
    syllables = rng.randint(2, 3)
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(_SUFFIXES)


class _Dag:
    """Adjacency sets over node ids with the reachability queries the constraints need."""

    def __init__(self, num_nodes: int) -> None:
        self.children: list[set[int]] = [set() for _ in range(num_nodes)]
        self.edges: list[tuple[int, int]] = []

    def add(self, u: int, w: int) -> None:
        self.children[u].add(w)
        self.edges.append((u, w))

    def distances(self, source: int) -> dict[int, int]:
        """BFS edge counts from ``source`` to every node it reaches (itself at 0)."""
        dist = {source: 0}
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for w in self.children[u]:
                if w not in dist:
                    dist[w] = dist[u] + 1
                    queue.append(w)
        return dist


@dataclass(frozen=True)
class _Spec:
    """The fixed roles of one sample's graph: root, gold path, both options."""

    root: int
    correct: int
    wrong: int
    path_len: int


def _edge_allowed(dag: _Dag, spec: _Spec, u: int, w: int) -> bool:
    """All invariants of the module docstring, checked for a candidate edge u → w."""
    if u == w or u in (spec.correct, spec.wrong) or w in dag.children[u]:
        return False
    from_w = dag.distances(w)
    if u in from_w:  # cycle
        return False
    from_root = dag.distances(spec.root)
    if u in from_root:
        if spec.wrong in from_w:
            return False
        if spec.correct in from_w and from_root[u] + 1 + from_w[spec.correct] < spec.path_len:
            return False
    return True


def _try_add(rng: random.Random, dag: _Dag, spec: _Spec, u: int | None, w: int | None, n: int) -> bool:
    """Add an edge with the given end(s), drawing any missing end at random; False if none fit."""
    for _ in range(_MAX_EDGE_TRIES):
        a = rng.randrange(n) if u is None else u
        b = rng.randrange(n) if w is None else w
        if _edge_allowed(dag, spec, a, b):
            dag.add(a, b)
            return True
    return False


def _build_graph(rng: random.Random, num_nodes: int, path_len: int, edge_factor: float) -> tuple[_Dag, _Spec]:
    """Node ids: 0..path_len is the gold path, path_len+1 the wrong option, the rest free."""
    dag = _Dag(num_nodes)
    spec = _Spec(root=0, correct=path_len, wrong=path_len + 1, path_len=path_len)
    for i in range(path_len):
        dag.add(i, i + 1)
    free = list(range(path_len + 2, num_nodes))
    rng.shuffle(free)
    wrong_len = rng.randint(max(1, path_len // 2), path_len)
    into_correct = rng.randint(1, max(1, path_len // 2))
    wrong_chain = [free.pop() for _ in range(min(wrong_len, len(free)))] + [spec.wrong]
    correct_chain = [free.pop() for _ in range(min(into_correct, len(free)))] + [spec.correct]
    for chain in (wrong_chain, correct_chain):
        for a, b in zip(chain, chain[1:]):
            dag.add(a, b)
    for node in free:  # every concept must appear in some fact
        if rng.random() < 0.5:
            _try_add(rng, dag, spec, node, None, num_nodes) or _try_add(rng, dag, spec, None, node, num_nodes)
        else:
            _try_add(rng, dag, spec, None, node, num_nodes) or _try_add(rng, dag, spec, node, None, num_nodes)
    target_edges = int(round(edge_factor * num_nodes))
    attempts = 0
    while len(dag.edges) < target_edges and attempts < 4 * target_edges:
        _try_add(rng, dag, spec, None, None, num_nodes)
        attempts += 1
    return dag, spec


def _name_pool(size: int) -> list[str]:
    """The fixed list of `size` concept names (`name_pool`): one seed for every call, so the training and
    evaluation streams draw from the same words."""
    return distinct_words(random.Random(f"prosqa-name-pool-{size}"), size, _concept_name)


def _make_sample(
    rng: random.Random, nodes_range: tuple[int, int], path_range: tuple[int, int], edge_factor: float,
    pool: list[str] | None = None,
) -> dict[str, Any]:
    path_len = rng.randint(*path_range)
    num_nodes = rng.randint(*nodes_range)
    dag, spec = _build_graph(rng, num_nodes, path_len, edge_factor)
    names = distinct_words(rng, num_nodes, _concept_name) if pool is None else rng.sample(pool, num_nodes)
    entity = rng.choice(_PEOPLE)
    root, correct, wrong = names[spec.root], names[spec.correct], names[spec.wrong]
    edges = [[names[u], names[w]] for u, w in dag.edges]
    facts = [f"Every {a} is a {b}." for a, b in edges]
    rng.shuffle(facts)
    options = [correct, wrong]
    rng.shuffle(options)
    question = " ".join(facts + [f"{entity} is a {root}.", f"Is {entity} a {options[0]} or a {options[1]}?"])
    steps = [f"{entity} is a {root}."] + [f"Every {names[i]} is a {names[i + 1]}." for i in range(path_len)]
    answer = f"{entity} is a {correct}."
    used = {x for pair in edges for x in pair}
    return {
        "question": question,
        "steps": steps,
        "answer": answer,
        "prompt": question + "\n",
        "target": "\n".join(steps) + "\n### " + answer,
        "entity": entity,
        "root": root,
        "correct": correct,
        "wrong": wrong,
        "edges": edges,
        "num_nodes": len(used),
        "path_len": path_len,
    }


def _validate(nodes_range: tuple[int, int], path_range: tuple[int, int], edge_factor: float,
              name_pool: int | None = None) -> None:
    """The gold path, the wrong option and its chain need room among the nodes; a name pool needs a name
    for every node."""
    if name_pool is not None and name_pool < nodes_range[1]:
        raise ValueError(f"name_pool {name_pool} is smaller than the largest graph ({nodes_range[1]} nodes)")
    if not (1 <= path_range[0] <= path_range[1]):
        raise ValueError(f"path_range must satisfy 1 <= lo <= hi, got {path_range}")
    if not (nodes_range[0] <= nodes_range[1]):
        raise ValueError(f"nodes_range must satisfy lo <= hi, got {nodes_range}")
    if nodes_range[0] < path_range[1] + 4:
        raise ValueError(f"nodes_range {nodes_range} too small for paths up to {path_range[1]} edges")
    if edge_factor <= 0:
        raise ValueError(f"edge_factor must be > 0, got {edge_factor}")


def iter_prosqa_hard(
    num_samples: int | None,
    nodes_range: tuple[int, int] = (56, 64),
    path_range: tuple[int, int] = (7, 9),
    edge_factor: float = 1.5,
    seed: int = 0,
    stream: str = "train",
    name_pool: int | None = None,
) -> Iterator[dict[str, Any]]:
    """ProsQA-Hard samples one at a time (None: without end), deterministic in (seed, stream).

    Bad settings fail on the call. The first k samples are the same for any `num_samples` >= k, so
    a caller can show progress, or draw until it has enough, and get exactly what
    `generate_prosqa_hard` returns.
    """
    _validate(nodes_range, path_range, edge_factor, name_pool)
    pool = None if name_pool is None else _name_pool(name_pool)
    return seeded_samples("prosqa-hard", num_samples, seed, stream,
                          lambda rng: _make_sample(rng, nodes_range, path_range, edge_factor, pool))


def generate_prosqa_hard(
    num_samples: int,
    nodes_range: tuple[int, int] = (56, 64),
    path_range: tuple[int, int] = (7, 9),
    edge_factor: float = 1.5,
    seed: int = 0,
    stream: str = "train",
    name_pool: int | None = None,
) -> list[dict[str, Any]]:
    """``num_samples`` ProsQA-Hard samples, deterministic in (seed, stream)."""
    return list(iter_prosqa_hard(num_samples, nodes_range, path_range, edge_factor, seed, stream, name_pool))


def _sentences(text: str) -> list[str]:
    """Sentences ending in . or ? (one per line or run together)."""
    return [s.strip() for s in re.findall(r"[^.?!\n]+[.?!]", text) if s.strip()]


def check_path(sample: Mapping[str, Any], generated_steps_text: str) -> bool:
    """True iff the text states a valid path from the root to the correct option.

    Text after the first ``###`` (the answer section) is ignored. Accepted form: an optional
    first sentence "Entity is a Root.", then "Every X is a Y." sentences where each X is the
    concept reached so far and each (X, Y) is a fact of the question, optionally closed by
    "Entity is a Z." with Z the concept reached. The path must take at least one step and end
    at the correct option; any other sentence makes it invalid.
    """
    edges = {(a, b) for a, b in sample["edges"]}
    entity, current = sample["entity"], sample["root"]
    sentences = _sentences(generated_steps_text.split("###", 1)[0])
    membership = re.compile(rf"{re.escape(entity)} is an? ([a-z]+)\.")
    if sentences and (m := membership.fullmatch(sentences[0])):
        if m.group(1) != current:
            return False
        sentences = sentences[1:]
    steps = 0
    for i, sentence in enumerate(sentences):
        if m := _EVERY.fullmatch(sentence):
            if m.group(1) != current or (m.group(1), m.group(2)) not in edges:
                return False
            current, steps = m.group(2), steps + 1
        elif (m := membership.fullmatch(sentence)) and i == len(sentences) - 1:
            if m.group(1) != current:
                return False
        else:
            return False
    return steps > 0 and current == sample["correct"]


def check_answer(sample: Mapping[str, Any], generated_text: str) -> bool:
    """True iff the last "Entity is a X." sentence of the answer section names the correct option.

    The answer section is the text after the last ``###`` if present, else the whole text.
    """
    section = generated_text.rsplit("###", 1)[-1]
    membership = re.compile(rf"{re.escape(sample['entity'])} is an? ([a-z]+)\.")
    found = [m.group(1) for s in _sentences(section) if (m := membership.fullmatch(s))]
    return bool(found) and found[-1] == sample["correct"]
