"""Loaders for the chain-of-thought finetuning sets, normalised to ``{prompt, target, answer}``.

* GSM-Aug (Deng et al. 2023): a local JSON-lines or parquet file when ``path`` is given, otherwise the
  Hugging Face hub (``whynlp/gsm8k-aug`` for the symbolic variant, ``whynlp/gsm8k-aug-nl`` for
  natural language). Records need ``question`` (str), ``steps`` (list[str] or str) and
  ``answer`` (str or number).
* HotpotQA CoT: a local JSON-lines or parquet file (the authors generated it with a teacher model; it is
  not on the hub). Records need ``question``, ``steps``, ``answer``; ``context`` (str, or a list
  of str shown as "Document i: …" lines) is optional.

Normalised record (all strings):

* ``prompt``: the question (for HotpotQA followed by "\\nContext:\\n" and the documents), then "\\n"
* ``target``: the steps, one per line, then "\\n#### " and the answer, so that
  ``t2mlr.tasks.scoring.extract_gsm_answer`` recovers the answer from a generated target
* ``answer``: the reference answer, stripped
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t2mlr.tasks.jsonl import read_records
from t2mlr.tasks.scoring import extract_math_answer

__all__ = ["GSM_AUG_HUB", "DataUnavailableError", "load_gsm_aug", "load_hotpotqa_cot", "normalise_cot_record"]

GSM_AUG_HUB = {"symbolic": "whynlp/gsm8k-aug", "nl": "whynlp/gsm8k-aug-nl"}


class DataUnavailableError(RuntimeError):
    """Neither a local file nor the hub could provide the requested data."""


def _steps_text(steps: Any, where: str) -> str:
    """Steps as newline-separated text; a list or an already-joined string are both accepted."""
    if isinstance(steps, str):
        return steps.strip()
    if isinstance(steps, Sequence) and all(isinstance(s, str) for s in steps):
        return "\n".join(s.strip() for s in steps)
    raise ValueError(f"{where}: 'steps' must be a string or a list of strings, got {type(steps).__name__}")


def _context_text(context: Any, where: str) -> str:
    """HotpotQA context as text; a list becomes numbered "Document i:" lines."""
    if isinstance(context, str):
        return context.strip()
    if isinstance(context, Sequence) and all(isinstance(c, str) for c in context):
        return "\n".join(f"Document {i}: {c.strip()}" for i, c in enumerate(context, start=1))
    raise ValueError(f"{where}: 'context' must be a string or a list of strings, got {type(context).__name__}")


def normalise_cot_record(record: Mapping[str, Any], where: str = "record") -> dict[str, str]:
    """``{prompt, target, answer}`` from a question/steps/answer(/context) record."""
    missing = [key for key in ("question", "steps", "answer") if key not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; have {sorted(record)}")
    question = str(record["question"]).strip()
    answer = str(record["answer"]).strip()
    prompt = question
    if record.get("context"):
        prompt += "\nContext:\n" + _context_text(record["context"], where)
    steps = _steps_text(record["steps"], where)
    target = (steps + "\n" if steps else "") + "#### " + answer
    return {"prompt": prompt + "\n", "target": target, "answer": answer}


def normalise_cot_records(records: Sequence[Mapping[str, Any]], source: str,
                          limit: int | None = None) -> list[dict[str, str]]:
    """`normalise_cot_record` of the first `limit` records (all with None), each named by its index in `source`."""
    chosen = records if limit is None else records[:limit]
    return [normalise_cot_record(r, f"{source} record {i}") for i, r in enumerate(chosen)]


def _local_records(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise DataUnavailableError(f"local data file not found: {path}")
    return read_records(path)


def _hub_records(name: str, split: str) -> list[dict[str, Any]]:
    """Load a hub dataset split; network and not-found failures become DataUnavailableError."""
    import datasets  # imported here: it is slow to import and only this path needs it

    try:
        data = datasets.load_dataset(name, split=split)
    except (OSError, ValueError) as err:  # ConnectionError, hub HTTP errors and DatasetNotFoundError are OSErrors
        raise DataUnavailableError(
            f"could not load {name!r} split {split!r} from the Hugging Face hub ({type(err).__name__}: {err}); "
            "pass path=<local .jsonl with question/steps/answer> instead"
        ) from err
    return [dict(row) for row in data]


def load_gsm_aug(
    path: str | Path | None = None, split: str = "train", variant: str = "symbolic", limit: int | None = None
) -> list[dict[str, str]]:
    """GSM-Aug records, from ``path`` (JSON lines or parquet) if given, else from the hub."""
    if variant not in GSM_AUG_HUB:
        raise ValueError(f"variant must be one of {sorted(GSM_AUG_HUB)}, got {variant!r}")
    if path is not None:
        return normalise_cot_records(_local_records(path), str(path), limit)
    name = GSM_AUG_HUB[variant]
    return normalise_cot_records(_hub_records(name, split), name, limit)


def load_hotpotqa_cot(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """HotpotQA chain-of-thought records from a local JSON-lines or parquet file."""
    return normalise_cot_records(_local_records(path), str(path), limit)


# ------------------------------------------------------------------------------------------ the retrofit's sources
# Records ``{prompt, target, answer}`` whose prompt is "Question: <question>\nAnswer:\n" (`retrofit_prompt`); a
# reply is scored by its answer after "####" (GSM formats) or its last boxed answer (MATH-500).


def retrofit_prompt(question: str) -> str:
    """What a pretrained model reads before its reply in the retrofit experiment (training and evaluation)."""
    return f"Question: {question.strip()}\nAnswer:\n"


def _require_columns(row: dict[str, Any], columns: Sequence[str], path: Path, index: int) -> None:
    missing = [c for c in columns if c not in row]
    if missing:
        raise ValueError(f"{path} row {index}: missing column(s) {missing}; this format needs {list(columns)}")


def openmathreasoning_records(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """OpenMathReasoning rows → records: the solution is the target, the expected answer is appended
    after ``####`` so training and scoring read the answer in one place."""
    path, records = Path(path), []
    for i, row in enumerate(read_records(path)[:limit]):
        _require_columns(row, ("problem", "generated_solution", "expected_answer"), path, i)
        answer = str(row["expected_answer"]).strip()
        target = f"{str(row['generated_solution']).strip()}\n#### {answer}"
        records.append({"prompt": retrofit_prompt(str(row["problem"])), "target": target, "answer": answer})
    return records


def gsm8k_records(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """GSM8K rows → records (the answer is the number after the solution's ``####``)."""
    path, records = Path(path), []
    for i, row in enumerate(read_records(path)[:limit]):
        _require_columns(row, ("question", "answer"), path, i)
        solution = str(row["answer"])
        if "####" not in solution:
            raise ValueError(f"{path} row {i}: the answer has no '#### <number>' line")
        answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
        records.append({"prompt": retrofit_prompt(str(row["question"])), "target": solution.strip(), "answer": answer})
    return records


def math500_records(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """MATH-500 (or MATH) rows → records whose answer is the reference a boxed reply is compared with."""
    path, records = Path(path), []
    for i, row in enumerate(read_records(path)[:limit]):
        if "problem" not in row or ("answer" not in row and "solution" not in row):
            raise ValueError(f"{path} row {i}: a MATH-500 row needs 'problem' and 'answer' (HuggingFaceH4/MATH-500), "
                             f"or 'problem' and 'solution' (MATH); found columns {sorted(row)}")
        if "answer" in row:
            answer = str(row["answer"]).strip()
        else:
            answer = extract_math_answer(str(row["solution"])) or ""
        if not answer:
            raise ValueError(f"{path} row {i}: no reference answer (an empty 'answer', or a 'solution' without "
                             "a \\boxed{...})")
        records.append({"prompt": retrofit_prompt(str(row["problem"])), "target": str(row.get("solution", "")).strip(),
                        "answer": answer})
    return records
