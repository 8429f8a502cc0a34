"""The reasoning tasks of the finetunes (`t2mlr experiment finetune`): where their data come from and how an
output is scored.

Every task yields records with ``prompt`` (the text the model is given), ``target`` (the supervised
continuation: the answer or chain of thought) and ``answer`` (the gold answer), plus what its scorer needs:

* ``variable-assignment``: generated (``t2mlr.tasks.variable_assignment``); pass@1 = the first generated
  token is the queried digit.
* ``prosqa-hard``: generated (``t2mlr.tasks.prosqa``); pass@1 = the generated steps are a valid path in the
  sample's graph from the root to the correct option (the task's path checker); the record keeps the graph.
* ``pathfinding`` (``t2mlr experiment pathfinding``): generated (``t2mlr.tasks.pathfinding``) or the release's
  files (``--data``, every row checked); pass@1 = the reply's path is a shortest path of the record's graph
  from its start to its end (any one of them); the record keeps the graph.
* ``gsm-aug``: GSM8K-Aug (question/steps/answer, symbolic or natural-language variant) from a local file or
  directory, or the published hub set; pass@1 = the number after the answer marker ``####`` equals the answer.
* ``hotpotqa``: chain-of-thought HotpotQA (question/steps/answer, optional context) from a local file or
  directory; pass@1 = exact match of the boxed answer (``\\boxed{...}``, else the text after ``####``) after
  HotpotQA's normalisation; token F1 is reported too.

Held-out evaluation: generated tasks draw training and evaluation from separate seeded streams; a data
directory gives ``train`` and ``test`` (or ``eval``) splits, each ``.jsonl`` or ``.parquet`` or, as in a
downloaded hub snapshot, ``data/train-*.parquet`` shards; a single file (either format) is split, its last
``eval_size`` distinct questions held out. Evaluation records whose prompt also occurs in training are
dropped in every case, so no evaluation problem is ever trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t2mlr.tasks.jsonl import read_records
from t2mlr.tasks.loaders import GSM_AUG_HUB, load_gsm_aug, normalise_cot_records
from t2mlr.tasks.pathfinding import ARROW, generate_pathfinding, load_pathfinding_data, score_path
from t2mlr.tasks.prosqa import check_answer, check_path, generate_prosqa_hard
from t2mlr.tasks.scoring import (
    extract_boxed_answer,
    extract_gsm_answer,
    gsm_exact_match,
    qa_exact_match,
    qa_token_f1,
    variable_assignment_exact_match,
)
from t2mlr.tasks.variable_assignment import HEADER as VA_HEADER
from t2mlr.tasks.variable_assignment import generate_variable_assignment

__all__ = ["TASKS", "Scored", "TaskSpec", "get_task", "load_task_data", "score_output"]

GSM_VARIANTS = tuple(GSM_AUG_HUB)
PROSQA_FIELDS = ("entity", "root", "correct", "edges")  # what the path checker reads from a record
PATHFINDING_FIELDS = ("edges", "start", "end")  # what the shortest-path scorer reads from a record


@dataclass(frozen=True)
class Scored:
    """One output scored: the extracted answer (None: none found), whether it counts for pass@1, and any
    further per-task numbers (HotpotQA: token F1; ProsQA: whether the final answer names the right option)."""

    extracted: str | None
    correct: bool
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """A task's name, label, scorer and the extra record fields its scorer needs."""

    name: str
    label: str
    score: Callable[[Mapping[str, Any], str], Scored]
    needs_data: bool = False
    checker_fields: tuple[str, ...] = ()
    phrases: tuple[str, ...] = ()  # multi-character symbols of a from-scratch word tokenizer
    syllables: bool = False  # add consonant-vowel pairs (ProsQA's made-up concept names)


def _score_variable_assignment(record: Mapping[str, Any], text: str) -> Scored:
    stripped = text.strip().lstrip("|").strip()
    extracted = stripped.split()[0] if stripped else None
    return Scored(extracted, variable_assignment_exact_match(text, str(record["answer"])))


def _score_prosqa(record: Mapping[str, Any], text: str) -> Scored:
    answer = text.rsplit("###", 1)[1].strip() if "###" in text else None
    return Scored(answer or None, check_path(record, text), {"answer_correct": float(check_answer(record, text))})


def _score_pathfinding(record: Mapping[str, Any], text: str) -> Scored:
    nodes, correct = score_path(record, text)
    return Scored(None if nodes is None else ARROW.join(nodes), correct)


def _score_gsm(record: Mapping[str, Any], text: str) -> Scored:
    return Scored(extract_gsm_answer(text), gsm_exact_match(text, str(record["answer"])))


def _score_hotpotqa(record: Mapping[str, Any], text: str) -> Scored:
    extracted = extract_boxed_answer(text)
    gold = str(record["answer"])
    return Scored(extracted, qa_exact_match(extracted, gold), {"f1": qa_token_f1(extracted, gold)})


TASKS: dict[str, TaskSpec] = {
    "variable-assignment": TaskSpec(
        "variable-assignment", "Variable assignment (depth 5)", _score_variable_assignment,
        phrases=(VA_HEADER, "=___", "Answer: |"),
    ),
    "prosqa-hard": TaskSpec(
        "prosqa-hard", "ProsQA-Hard", _score_prosqa, checker_fields=PROSQA_FIELDS,
        phrases=("Every ", " is a ", " is an ", "Is ", " or a ", ". ", "### "), syllables=True,
    ),
    "pathfinding": TaskSpec(
        "pathfinding", "Pathfinding", _score_pathfinding, checker_fields=PATHFINDING_FIELDS,
        phrases=("Find the shortest path in this directed graph.\n", "Start: ", "End: ", "Edges:\n", ARROW,
                 "Answer: ", "Wait "), syllables=True,
    ),
    "gsm-aug": TaskSpec("gsm-aug", "GSM-Aug", _score_gsm, needs_data=True, phrases=("#### ", "<<", ">>")),
    "hotpotqa": TaskSpec("hotpotqa", "HotpotQA (CoT)", _score_hotpotqa, needs_data=True,
                         phrases=("#### ", "\nContext:\n", "Document ")),
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks are {', '.join(TASKS)}")
    return TASKS[name]


def score_output(task: str, record: Mapping[str, Any], text: str) -> Scored:
    """Score one generated text against its record (the same call re-scores a predictions file)."""
    return get_task(task).score(record, text)


def task_label(task: str, variant: str | None) -> str:
    label = get_task(task).label
    return f"{label} ({'natural language' if variant == 'nl' else 'symbolic'})" if task == "gsm-aug" else label


# ---------------------------------------------------------------------------------------------- data


def _generated(task: str, settings: Mapping[str, Any], size: int, seed: int, stream: str) -> list[dict[str, Any]]:
    if task == "variable-assignment":
        # `train_min_depth`: training samples mix depths train_min_depth..depth; evaluation stays at `depth`
        settings = dict(settings)
        min_depth = settings.pop("train_min_depth", None)
        rows = generate_variable_assignment(size, seed=seed, stream=stream, **settings,
                                            min_depth=min_depth if stream == "train" else None)
        return [{k: r[k] for k in ("prompt", "target", "answer")} for r in rows]
    if task == "pathfinding":
        return [_pathfinding_record(r) for r in generate_pathfinding(size, seed=seed, stream=stream, **settings)]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    rows = generate_prosqa_hard(size, seed=seed, stream=stream, **kwargs)
    return [{k: r[k] for k in ("prompt", "target", "answer", *PROSQA_FIELDS)} for r in rows]


def _pathfinding_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """A pathfinding row (the release's fields) as a finetune record: its question is the prompt, its response
    the target."""
    return {"prompt": row["question"], "target": row.get("response", row["answer"]), "answer": row["answer"],
            **{k: row[k] for k in PATHFINDING_FIELDS}}


def _split_rows(directory: Path, split: str) -> list[dict[str, Any]] | None:
    """A data directory's rows of one split: `split.jsonl` or `split.parquet`, or the shards a hub snapshot
    keeps under `data/` (`data/split-00000-of-00002.parquet`, ...), in name order; None when there is none."""
    for name in (f"{split}.jsonl", f"{split}.parquet"):
        if (directory / name).is_file():
            return read_records(directory / name)
    shards = sorted((directory / "data").glob(f"{split}-*.parquet"))
    return [row for shard in shards for row in read_records(shard)] if shards else None


def _split_file(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Raw train and test records of a data directory (train + test or eval splits, JSON lines or parquet)
    or of one file."""
    if path.is_dir():
        train = _split_rows(path, "train")
        test = next((rows for split in ("test", "eval") if (rows := _split_rows(path, split)) is not None), None)
        if train is None or test is None:
            raise ValueError(f"data directory {path} must hold train and test (or eval) splits: train.jsonl and "
                             "test.jsonl, the same as .parquet, or a hub snapshot's data/train-*.parquet and "
                             "data/test-*.parquet")
        return train, test
    if not path.is_file():
        raise ValueError(f"data {str(path)!r} is neither a local file or directory nor a published hub set")
    return read_records(path), None


def check_data_source(task: str, data: str | None, variant: str | None) -> bool:
    """Whether `data` names a published hub set (else it is a local file or directory), refused when a task that
    reads data has none, the hub set is the other variant's, or the local path does not exist: checks that need
    nothing loaded, so the command line makes them before torch loads."""
    if data is None:
        raise ValueError(f"task {task} needs --data (a local .jsonl/.parquet file or directory"
                         + (f", or the hub set {GSM_AUG_HUB[variant or 'symbolic']}" if task == "gsm-aug" else "") + ")")
    if task == "gsm-aug" and data in GSM_AUG_HUB.values() and not Path(data).exists():
        if data != GSM_AUG_HUB[variant or "symbolic"]:
            raise ValueError(f"--data {data} is the {'nl' if data.endswith('nl') else 'symbolic'} set but --variant "
                             f"is {variant!r}")
        return True
    if not Path(data).exists():
        raise ValueError(f"data {data!r} is neither a local file or directory nor a published hub set")
    return False


def _from_data(task: str, data: str | None, variant: str | None, eval_size: int) -> tuple[list, list]:
    if check_data_source(task, data, variant):
        return load_gsm_aug(split="train", variant=variant), load_gsm_aug(split="test", variant=variant)
    train_raw, test_raw = _split_file(Path(data))
    train = normalise_cot_records(train_raw, f"{data} (train)")
    if test_raw is not None:
        return train, normalise_cot_records(test_raw, f"{data} (test)")
    distinct = list({r["prompt"]: r for r in train}.values())
    if len(distinct) <= eval_size:
        raise ValueError(f"{data} has {len(distinct)} distinct questions: too few to hold out {eval_size} for evaluation")
    held = {r["prompt"] for r in distinct[-eval_size:]}
    return [r for r in train if r["prompt"] not in held], distinct[-eval_size:]


def load_task_data(
    task: str, settings: Mapping[str, Any], train_size: int, eval_size: int, seed: int,
    data: str | None = None, variant: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Training records, held-out evaluation records (at most `eval_size`) and how many evaluation records
    were dropped because their prompt occurs in training."""
    spec = get_task(task)
    if spec.needs_data:
        if task == "gsm-aug" and variant not in GSM_VARIANTS:
            raise ValueError(f"--variant must be one of {GSM_VARIANTS} for gsm-aug, got {variant!r}")
        train, evaluation = _from_data(task, data, variant, eval_size)
        train = train[:train_size] if train_size else train
    elif task == "pathfinding" and data is not None:  # the release's files or this library's, every row checked
        train, evaluation = (list(map(_pathfinding_record, rows)) for rows in load_pathfinding_data(data, eval_size))
        train = train[:train_size] if train_size else train
    else:
        if data is not None:
            raise ValueError(f"task {task} generates its own data; --data is for gsm-aug, hotpotqa and pathfinding")
        train = _generated(task, settings, train_size, seed, "train")
        evaluation = _generated(task, settings, eval_size, seed, "eval")
    seen = {r["prompt"] for r in train}
    unseen = [r for r in evaluation if r["prompt"] not in seen]
    kept = unseen[:eval_size]
    if not train or not kept:
        raise ValueError(f"task {task}: {len(train)} training and {len(kept)} evaluation records; need both")
    return train, kept, len(evaluation) - len(unseen)
