"""HotpotQA with chain-of-thought traces, built into the data `t2mlr experiment finetune hotpotqa` reads.

The paper finetunes on HotpotQA questions answered with chain-of-thought traces written by a teacher model.
Those traces are not public: the authors' release (princeton-pli/T2MLR) has the training script, which reads
a prompt column ``question`` and a response column ``output``, but not the data. This module joins any traces
in that form with HotpotQA itself, which is public, so that whoever has or generates traces can run the task:

* HotpotQA: a local copy of the distractor setting (hub ``hotpotqa/hotpot_qa``, config ``distractor``), as
  JSON lines or parquet with the hub's columns ``id``, ``question``, ``answer``, ``context`` =
  ``{"title": [...], "sentences": [[...], ...]}``, or as the original release's JSON list (``_id``, and
  ``context`` = ``[[title, [sentence, ...]], ...]``).
* traces: JSON lines or parquet, one row per training question, keyed by ``id`` (or ``_id``) or, failing
  that, by the exact ``question`` text, with the teacher's reasoning in ``output`` (the authors' column) or
  ``steps`` (a string or a list of strings). The trace states its answer in a final ``\\boxed{...}`` (or
  after ``####``).

Rules (`build_hotpotqa_cot`):

* a training question is kept only when it has a trace whose stated answer equals HotpotQA's answer under
  HotpotQA's normalisation (`t2mlr.tasks.scoring.qa_exact_match`): a teacher's wrong trace would teach a
  wrong answer. Questions without a trace and traces with a wrong or missing answer are counted, not kept
  (``keep_wrong=True`` keeps the wrong ones, the reference answer still closing the target);
* a trace for a question that is not in the HotpotQA training file, or two traces for one question, is an
  error: the join must be unambiguous;
* evaluation questions need no trace: their records carry the question, the context and the answer.

Output (``write_hotpotqa_cot``): ``train.jsonl`` and ``test.jsonl`` of ``{id, question, context, steps,
answer}`` (``context``: one "Title: sentences" line per paragraph; ``steps``: the trace, verbatim) and
``meta.json`` with the counts, a directory that `t2mlr experiment finetune hotpotqa --data DIR` reads
(`t2mlr.tasks.loaders.normalise_cot_record` turns each record into prompt and target).

    t2mlr data hotpotqa-cot --hotpotqa-train hotpot_train.parquet --traces traces.jsonl \\
        --hotpotqa-eval hotpot_dev_distractor.parquet --out data/hotpotqa_cot
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from t2mlr.tasks.jsonl import read_records, write_jsonl
from t2mlr.tasks.scoring import extract_boxed_answer, qa_exact_match

__all__ = ["HotpotBuild", "build_hotpotqa_cot", "context_text", "read_hotpotqa", "write_hotpotqa_cot"]

_AMBIGUOUS = "\0several"  # by_text's mark for a question text that several training ids share


@dataclass(frozen=True)
class HotpotBuild:
    """The records built and what was left out, by reason."""

    train: list[dict[str, str]]
    test: list[dict[str, str]]
    no_trace: int
    wrong_answer: int
    no_answer_in_trace: int
    kept_wrong: int


def _read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local file: JSON lines or parquet, or the original release's single JSON list."""
    path = Path(path)
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: a .json file must hold a list of objects (the HotpotQA release's form)")
        return rows
    return read_records(path)


def context_text(context: Any, where: str) -> str:
    """HotpotQA's paragraphs as "Title: sentence sentence …" lines, from either published layout."""
    if isinstance(context, Mapping) and {"title", "sentences"} <= set(context):
        pairs = list(zip(context["title"], context["sentences"]))
    elif isinstance(context, Sequence) and not isinstance(context, str) and all(
            isinstance(p, Sequence) and len(p) == 2 for p in context):
        pairs = [(p[0], p[1]) for p in context]
    else:
        raise ValueError(f"{where}: 'context' must be the hub's {{title: [...], sentences: [[...]]}} or the "
                         f"release's [[title, [sentences]], ...], got {type(context).__name__}")
    lines = []
    for title, sentences in pairs:
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise ValueError(f"{where}: the sentences of paragraph {title!r} must be a list of strings")
        lines.append(f"{title}: {''.join(sentences).strip()}")  # HotpotQA's sentences carry their leading space
    return "\n".join(lines)


def _question_id(row: Mapping[str, Any]) -> str | None:
    value = row.get("id", row.get("_id"))
    return None if value is None else str(value)


def read_hotpotqa(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """HotpotQA rows as ``{id, question, context, answer}`` (the first `limit`); bad rows name their number."""
    records = []
    for i, row in enumerate(_read_rows(path)[:limit]):
        where = f"{path} row {i}"
        missing = [k for k in ("question", "answer", "context") if k not in row]
        if missing or _question_id(row) is None:
            raise ValueError(f"{where}: a HotpotQA row needs id (or _id), question, answer and context; "
                             f"missing {missing or ['id']}")
        records.append({"id": _question_id(row), "question": str(row["question"]).strip(),
                        "context": context_text(row["context"], where), "answer": str(row["answer"]).strip()})
    return records


def _trace_text(row: Mapping[str, Any], where: str) -> str:
    value = row.get("output", row.get("steps"))
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, Sequence) and value and all(isinstance(s, str) for s in value):
        return "\n".join(s.strip() for s in value)
    raise ValueError(f"{where}: a trace needs its reasoning in 'output' (a string, the authors' column) or "
                     f"'steps' (a string or a list of strings); got columns {sorted(row)}")


def _traces_by_question(rows: Iterable[Mapping[str, Any]], questions: Mapping[str, dict[str, str]],
                        by_text: Mapping[str, str], source: str) -> dict[str, str]:
    """Trace text by HotpotQA id; every trace must name exactly one training question, once."""
    traces: dict[str, str] = {}
    for i, row in enumerate(rows):
        where = f"{source} row {i}"
        key = _question_id(row)
        if key is None:
            if "question" not in row:
                raise ValueError(f"{where}: a trace needs id (or _id) or the question's text in 'question'")
            text = str(row["question"]).strip()
            key = by_text.get(text)
            if key is None:
                raise ValueError(f"{where}: no HotpotQA training question has this text: {text[:80]!r}")
            if key == _AMBIGUOUS:
                raise ValueError(f"{where}: several HotpotQA training questions have this text; key the traces by id")
        elif key not in questions:
            raise ValueError(f"{where}: id {key!r} is not in the HotpotQA training file")
        if key in traces:
            raise ValueError(f"{where}: a second trace for question {key!r}")
        traces[key] = _trace_text(row, where)
    return traces


def build_hotpotqa_cot(train_path: str | Path, traces_path: str | Path, eval_path: str | Path,
                       eval_size: int | None = None, keep_wrong: bool = False) -> HotpotBuild:
    """The finetune's records from HotpotQA files and a traces file (rules in the module docstring)."""
    questions = {r["id"]: r for r in read_hotpotqa(train_path)}
    by_text: dict[str, str] = {}
    for key, record in questions.items():
        by_text[record["question"]] = _AMBIGUOUS if record["question"] in by_text else key
    traces = _traces_by_question(_read_rows(traces_path), questions, by_text, str(traces_path))
    train, no_trace, wrong, no_answer, kept_wrong = [], 0, 0, 0, 0
    for key, record in questions.items():
        trace = traces.get(key)
        if trace is None:
            no_trace += 1
            continue
        stated = extract_boxed_answer(trace)
        if stated is None:
            no_answer += 1
            continue
        if not qa_exact_match(stated, record["answer"]):
            wrong += 1
            if not keep_wrong:
                continue
            kept_wrong += 1
        train.append({**record, "steps": trace})
    if not train:
        raise ValueError(f"no training record left: of {len(questions)} questions, {no_trace} have no trace, "
                         f"{no_answer} traces state no answer and {wrong} state a wrong one")
    test = [{**r, "steps": ""} for r in read_hotpotqa(eval_path, eval_size)]
    if not test:
        raise ValueError(f"{eval_path} has no evaluation questions")
    return HotpotBuild(train, test, no_trace, wrong, no_answer, kept_wrong)


def write_hotpotqa_cot(build: HotpotBuild, out: str | Path, sources: Mapping[str, Any]) -> list[Path]:
    """train.jsonl, test.jsonl and meta.json under `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(build.train, out / "train.jsonl")
    write_jsonl(build.test, out / "test.jsonl")
    counts = {k: v for k, v in asdict(build).items() if k not in ("train", "test")}
    meta = {**{k: str(v) if isinstance(v, Path) else v for k, v in sources.items()},
            "train_records": len(build.train), "test_records": len(build.test), **counts}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return [out / "train.jsonl", out / "test.jsonl", out / "meta.json"]
