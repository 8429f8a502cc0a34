"""Finetuning and evaluation data of the retrofit experiment: prompt/target pairs, tokenised so the
prompt is never scored (and, optionally, never fused with the recurrent state).

Every record is ``{prompt, target, answer}`` (``t2mlr.tasks.loaders.normalise_cot_record``'s form). The
model sees ``"Question: <question>\\nAnswer:\\n"`` and learns the reply ``"<steps, one per line>\\n####
<answer>"`` followed by the tokenizer's end-of-text token; the evaluation prompts are the same prompt
text, so a reply is scored by the number after ``####``.

Three sources give such records:

* ``arithmetic``: the generated GSM-Aug-format word problems of ``t2mlr.tasks.arithmetic`` (cpu preset);
* ``openmathreasoning``: a local jsonl/parquet file in OpenMathReasoning's published columns
  (``problem``, ``generated_solution``, ``expected_answer``; the paper's finetuning data);
* ``gsm8k``: a local jsonl/parquet file in GSM8K's published columns (``question``, ``answer`` ending
  in ``#### <number>``; the paper's evaluation data);
* ``math500``: a local jsonl/parquet file in MATH-500's published columns (``problem`` and ``answer``, as
  HuggingFaceH4/MATH-500 has them), or in MATH's (``problem`` and ``solution``, the answer then being the
  solution's last ``\\boxed{...}``); the paper's second evaluation. Replies are scored by their boxed answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from t2mlr.tasks.arithmetic import (
    ArithmeticSettings,
    arithmetic_cot_records,
    plain_prompt,
)
from t2mlr.tasks.jsonl import read_jsonl, read_records
from t2mlr.tasks.scoring import extract_math_answer
from t2mlr.tasks.sft import sft_row

__all__ = [
    "PromptTargetDataset",
    "arithmetic_records",
    "format_prompt",
    "gsm8k_records",
    "math500_records",
    "openmathreasoning_records",
    "prompt_target_dataset",
]


def format_prompt(question: str) -> str:
    """What the model reads before its reply (training and evaluation alike)."""
    return plain_prompt(question) + "\n"


def arithmetic_records(num: int, split: str, seed: int, settings: ArithmeticSettings) -> list[dict[str, str]]:
    """Generated problems as records whose prompt is ``format_prompt`` of the question."""
    records = arithmetic_cot_records(num, split, seed, settings)
    return [{**r, "prompt": format_prompt(r["prompt"].strip())} for r in records]


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
        records.append({"prompt": format_prompt(str(row["problem"])), "target": target, "answer": answer})
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
        records.append({"prompt": format_prompt(str(row["question"])), "target": solution.strip(), "answer": answer})
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
        records.append({"prompt": format_prompt(str(row["problem"])), "target": str(row.get("solution", "")).strip(),
                        "answer": answer})
    return records


class PromptTargetDataset(Dataset):
    """Rows ``{input_ids, labels}`` of prompt + target + end-of-text, unpadded.

    labels: -100 on the prompt (only the reply is scored). With ``mask_prompt_recurrence`` a row also
    has ``recurrence_mask``: False on the prompt (its tokens skip the fusion but still write the state,
    the way ``recurrence_mask_policy="mask"`` defines it), True on the reply. Rows longer than ``max_length`` are
    refused rather than cut, since a cut reply would teach a wrong answer.
    """

    labels_aligned_to_inputs = False

    def __init__(
        self, records: Sequence[dict[str, str]], tokenizer: PreTrainedTokenizerBase, max_length: int,
        mask_prompt_recurrence: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.rows = [self._encode(r, max_length, mask_prompt_recurrence, i) for i, r in enumerate(records)]

    def _encode(self, record: dict[str, str], max_length: int, mask_prompt: bool, index: int) -> dict[str, torch.Tensor]:
        row = sft_row(self.tokenizer, record["prompt"], record["target"], bos=False, recurrence_mask=mask_prompt)
        if row["input_ids"].numel() > max_length:
            raise ValueError(f"record {index} has {row['input_ids'].numel()} tokens, more than max_length={max_length}")
        return row

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def prompt_target_dataset(
    path: str, tokenizer: str, max_length: int, mask_prompt_recurrence: bool = False
) -> PromptTargetDataset:
    """The trainer's ``data.factory``: records from a jsonl file, tokenised with the tokenizer at ``tokenizer``
    (saved into every checkpoint of the run)."""
    return PromptTargetDataset(read_jsonl(path), AutoTokenizer.from_pretrained(tokenizer), max_length,
                               mask_prompt_recurrence)
