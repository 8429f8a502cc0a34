"""Verifiable tasks for reinforcement learning: prompts, a tokenizer, and a reward computed by the task's scorer.

A task hands the RL loop what it needs and nothing else: `prompts(start, count)` (deterministic in the
index, so a resumed run draws the same prompts), `reward(completion, sample)` (1.0 when the task's own
scorer accepts the completion), and a word-level tokenizer whose symbols are the task's (so a small model
trained from scratch, or SFT-trained by `t2mlr train`, shares it with the RL run).

The same module gives the supervised warm-up set (`variable_assignment_sft`, a `data.source: factory`
dataset for `t2mlr train`): prompt + answer + end-of-text, the prompt masked out of the loss.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from t2mlr.tasks.scoring import variable_assignment_exact_match
from t2mlr.tasks.tokenizers import build_word_tokenizer
from t2mlr.tasks.variable_assignment import HEADER, iter_variable_assignment
from t2mlr.utils import IGNORE_INDEX

ANSWER_CUE = "Answer: |"
# The header and the answer cue are one symbol each: a prompt is then ~4 tokens per assignment line.
VARIABLE_ASSIGNMENT_SYMBOLS = (HEADER, ANSWER_CUE, "___", "=", "\n", *"abcdefghijklmnopqrstuvwxyz", *"0123456789")


class VerifiableTask(Protocol):
    """What the RL loop asks of a task."""

    name: str
    tokenizer: Any

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        """Samples `start .. start + count - 1` of a stream; each has a "prompt" (text)."""

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        """The verifiable reward of one completion (text after the prompt, end-of-text removed)."""


def variable_assignment_tokenizer() -> Any:
    """One token per letter, digit, '=', newline and blank, plus one for the header and one for the cue."""
    return build_word_tokenizer(VARIABLE_ASSIGNMENT_SYMBOLS)


@dataclass
class VariableAssignmentTask:
    """Variable assignment (`t2mlr.tasks.variable_assignment`); reward 1 when the first symbol generated is
    the answer digit (`variable_assignment_exact_match`), else 0."""

    depth: int = 5
    num_constants: int = 3
    num_distractors: int = 2
    seed: int = 0
    name: str = "variable_assignment"

    def __post_init__(self) -> None:
        self.tokenizer = variable_assignment_tokenizer()
        next(iter_variable_assignment(1, self.depth, self.num_constants, self.num_distractors, self.seed))  # checks

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got {start}, {count}")
        samples = iter_variable_assignment(None, self.depth, self.num_constants, self.num_distractors, self.seed, stream)
        return list(itertools.islice(samples, start, start + count))

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        return float(variable_assignment_exact_match(completion, sample["answer"]))


TASKS = {"variable_assignment": VariableAssignmentTask}


def build_task(name: str, seed: int = 0, **kwargs: Any) -> VerifiableTask:
    """The task `name` with its generator's settings (`kwargs`: e.g. depth, num_constants, num_distractors)."""
    if name not in TASKS:
        raise ValueError(f"unknown RL task {name!r}; known: {', '.join(TASKS)}")
    try:
        return TASKS[name](seed=seed, **kwargs)
    except TypeError as err:
        raise ValueError(f"task {name!r}: bad settings {kwargs}: {err}") from err


class VariableAssignmentSFT(Dataset):
    """Supervised rows for `t2mlr train` (`data.source: factory`): prompt, answer digit, end-of-text.

    Only the answer and the end-of-text token are scored (labels -100 on the prompt), so the model learns
    what the RL reward checks. Every row of one setting has the same length (each assignment line is four
    symbols), so batches need no padding. `seq_len` is accepted for the trainer and must cover a row.
    """

    labels_aligned_to_inputs = False

    def __init__(self, num_samples: int, depth: int = 5, num_constants: int = 3, num_distractors: int = 2,
                 seed: int = 0, seq_len: int = 2048, stream: str = "train") -> None:
        self.task = VariableAssignmentTask(depth, num_constants, num_distractors, seed)
        self.tokenizer = self.task.tokenizer
        self.rows = [self._encode(sample) for sample in self.task.prompts(0, num_samples, stream)]
        longest = max((len(row["input_ids"]) for row in self.rows), default=0)
        if longest > seq_len:
            raise ValueError(f"rows have {longest} tokens but seq_len is {seq_len}; raise data.seq_len")

    def _encode(self, sample: dict[str, Any]) -> dict[str, torch.Tensor]:
        prompt = self.tokenizer(sample["prompt"], add_special_tokens=False)["input_ids"]
        answer = self.tokenizer(sample["answer"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor(prompt + answer + [self.tokenizer.eos_token_id])
        labels = ids.clone()
        labels[: len(prompt)] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def variable_assignment_sft(num_samples: int, depth: int = 5, num_constants: int = 3, num_distractors: int = 2,
                            seed: int = 0, seq_len: int = 2048, stream: str = "train") -> VariableAssignmentSFT:
    """The `data.factory` entry point (`t2mlr.training.rl_tasks:variable_assignment_sft`)."""
    return VariableAssignmentSFT(num_samples, depth, num_constants, num_distractors, seed, seq_len, stream)
