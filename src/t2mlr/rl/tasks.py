"""Verifiable tasks for reinforcement learning: prompts, a tokenizer, and a reward computed by the task's scorer.

A task hands the RL trainer what it needs and nothing else: `prompts(start, count)` (deterministic in the
index, so a resumed run draws the same prompts), `reward(completion, sample)` (1.0 when the task's own
scorer accepts the completion), and a word-level tokenizer whose symbols are the task's (so a small model
trained from scratch, or SFT-trained by `t2mlr train`, shares it with the RL run). A policy saved with its
own tokenizer (a retrofit) brings that one instead; the prompts and rewards are plain text either way.

Tasks (`TASKS`, the `task.name` of a GRPO config): `variable_assignment`, `s5_retrieval` and `arithmetic`.
Each reuses its generator in `t2mlr.tasks` and its scorer in `t2mlr.tasks.scoring`. For TRL, `prompt_dataset`
turns a window of a task's stream into the `prompt` dataset `GRPOTrainer` reads (each row keeps its sample,
serialised, for the reward), and `TaskReward` is the task's scorer as a TRL reward function.

The same module gives the supervised warm-up set (`variable_assignment_sft`, a `data.source: factory`
dataset for `t2mlr train`): prompt + answer + end-of-text, the prompt masked out of the loss.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


from t2mlr.tasks.arithmetic import ArithmeticSettings, iter_arithmetic_problems
from t2mlr.tasks.loaders import normalise_cot_record
from t2mlr.tasks.s5 import is_perm_token
from t2mlr.tasks.s5_retrieval import DEFAULT_ALPHABET, DELIMITER, iter_s5_retrieval
from t2mlr.tasks.scoring import (
    gsm_exact_match,
    score_s5_prediction,
    variable_assignment_exact_match,
)
from t2mlr.tasks.sft import SFTDataset
from t2mlr.tasks.tokenizers import build_s5_tokenizer, build_word_tokenizer
from t2mlr.tasks.variable_assignment import HEADER, iter_variable_assignment

ANSWER_CUE = "Answer: |"
# One token per letter, digit, '=', newline and blank, plus one for the header and one for the cue: a prompt is
# then ~4 tokens per assignment line.
VARIABLE_ASSIGNMENT_SYMBOLS = (HEADER, ANSWER_CUE, "___", "=", "\n", *"abcdefghijklmnopqrstuvwxyz", *"0123456789")


class VerifiableTask(Protocol):
    """What the RL loop asks of a task."""

    name: str
    tokenizer: Any

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        """Samples `start .. start + count - 1` of a stream; each has a "prompt" (text)."""

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        """The verifiable reward of one completion (text after the prompt, end-of-text removed)."""


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
        self.tokenizer = build_word_tokenizer(VARIABLE_ASSIGNMENT_SYMBOLS)
        self._windows = StreamWindows(lambda stream: iter_variable_assignment(
            None, self.depth, self.num_constants, self.num_distractors, self.seed, stream))

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        return self._windows.window(stream, start, count)

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        return float(variable_assignment_exact_match(completion, sample["answer"]))


class StreamWindows:
    """Samples start .. start + count - 1 of deterministic sample streams, read forward.

    The RL loop asks for consecutive windows of a stream; drawing each from the stream's start would cost
    O(steps²) over a run. One open iterator per stream is advanced instead, and a window before its
    position (a resumed run, an evaluation set read again) reopens the stream: the samples are the same
    either way, because the stream is deterministic in its index. The task's settings are checked on
    construction, by drawing the first sample of its "train" stream."""

    def __init__(self, open_stream: Callable[[str], Iterator[dict[str, Any]]]) -> None:
        next(open_stream("train"))
        self._open_stream = open_stream
        self._cursors: dict[str, tuple[Iterator[dict[str, Any]], int]] = {}

    def window(self, stream: str, start: int, count: int) -> list[dict[str, Any]]:
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got {start}, {count}")
        samples, position = self._cursors.get(stream, (None, 0))
        if samples is None or start < position:
            samples, position = self._open_stream(stream), 0
        window = list(itertools.islice(samples, start - position, start - position + count))
        self._cursors[stream] = (samples, start + len(window))
        return window


@dataclass
class S5RetrievalTask:
    """S5-Retrieval (`t2mlr.tasks.s5_retrieval`) in a generative form; reward 1 when the completion is exactly
    the scored target, else 0.

    The S5 experiment trains a transduction: the input is the dictionary, the delimiter, then each action
    followed by K blanks, and the output at each position after the delimiter is the running state and its
    K dictionary symbols. Here the same sample is a prompt and a completion: the prompt is the dictionary,
    then the N actions (one symbol each; the blanks were only slots for the aligned outputs), then the
    delimiter; the completion is the scored part of the transduction target, state and K values per step,
    N·(K+1) symbols (so `grpo.max_new_tokens` must be at least N·(K+1) + 1 for the end-of-text). A
    completion that is right here is, symbol for symbol, an exact match of the transduction
    (`score_s5_prediction` on the target after the delimiter), which is how the reward is computed.
    """

    n_range: tuple[int, int] | list[int] = (1, 32)  # the generator's defaults; a CPU run sets small ones
    k: int = 4
    dict_size: int = 120
    alphabet: str = DEFAULT_ALPHABET
    seed: int = 0
    name: str = "s5_retrieval"

    def __post_init__(self) -> None:
        if len(self.n_range) != 2:
            raise ValueError(f"n_range must be [lowest N, highest N], got {self.n_range!r}")
        self.n_range = (int(self.n_range[0]), int(self.n_range[1]))
        self.tokenizer = build_s5_tokenizer(self.k, self.alphabet)
        self._windows = StreamWindows(lambda stream: iter_s5_retrieval(
            None, self.n_range, self.k, self.dict_size, self.seed, self.alphabet, stream))

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        return [self._generative(s) for s in self._windows.window(stream, start, count)]

    @staticmethod
    def _generative(sample: dict[str, Any]) -> dict[str, Any]:
        """The sample with its prompt (dictionary, actions, delimiter) and answer (the scored target) as text."""
        delim = sample["delim_index"]
        actions = [token for token in sample["input_tokens"][delim + 1:] if is_perm_token(token)]
        prompt = "".join([*sample["input_tokens"][:delim], *actions, DELIMITER])
        return {**sample, "prompt": prompt, "answer": "".join(sample["target_tokens"][sample["score_start"]:])}

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        target, start = sample["target_tokens"], int(sample["score_start"])
        symbols = self.tokenizer.tokenize(completion)
        if len(symbols) != len(target) - start:
            return 0.0  # too short or too long: not the scored part
        return float(score_s5_prediction([*target[:start], *symbols], target, start).exact)


# Printable ASCII plus space and newline, one token each: covers every story, equation and "#### answer".
ARITHMETIC_SYMBOLS = (*string.ascii_letters, *string.digits, *string.punctuation, " ", "\n")


def arithmetic_tokenizer() -> Any:
    """A character-level tokenizer (printable ASCII, space, newline), built offline and always the same."""
    return build_word_tokenizer(ARITHMETIC_SYMBOLS)


@dataclass
class ArithmeticTask:
    """Arithmetic word problems (`t2mlr.tasks.arithmetic`, GSM-Aug format); reward 1 when the final answer
    of the completion, extracted by `gsm_exact_match` ("#### n", else "The answer is n", else the last
    number), equals the gold answer, else 0.

    The prompt is the question and a newline (`normalise_cot_record`, what `t2mlr train` finetunes on); the
    expected completion is the `<<a op b=c>>` steps, one per line, then "#### answer". The "train" and
    "eval" streams are the generator's splits, disjoint by construction. Settings are `ArithmeticSettings`'.
    """

    min_steps: int = ArithmeticSettings.min_steps
    max_steps: int = ArithmeticSettings.max_steps
    max_operand: int = ArithmeticSettings.max_operand
    max_factor: int = ArithmeticSettings.max_factor
    max_value: int = ArithmeticSettings.max_value
    seed: int = 0
    name: str = "arithmetic"

    def __post_init__(self) -> None:
        self.settings = ArithmeticSettings(self.min_steps, self.max_steps, self.max_operand, self.max_factor,
                                           self.max_value)
        self.tokenizer = arithmetic_tokenizer()
        self._windows = StreamWindows(lambda stream: iter_arithmetic_problems(stream, self.seed, self.settings))

    def prompts(self, start: int, count: int, stream: str = "train") -> list[dict[str, Any]]:
        problems = self._windows.window(stream, start, count)
        return [{**p, **normalise_cot_record(p, f"arithmetic {stream} problem")} for p in problems]

    def reward(self, completion: str, sample: dict[str, Any]) -> float:
        return float(gsm_exact_match(completion, sample["answer"]))


TASKS = {"variable_assignment": VariableAssignmentTask, "s5_retrieval": S5RetrievalTask, "arithmetic": ArithmeticTask}


def build_task(name: str, seed: int = 0, **kwargs: Any) -> VerifiableTask:
    """The task `name` with its generator's settings (`kwargs`: e.g. depth, num_constants, num_distractors)."""
    if name not in TASKS:
        raise ValueError(f"unknown RL task {name!r}; known: {', '.join(TASKS)}")
    allowed = [f.name for f in dataclasses.fields(TASKS[name]) if f.name not in ("seed", "name")]  # task.kwargs
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"task {name!r}: unknown setting(s) {unknown}; allowed: {', '.join(allowed)}")
    try:
        return TASKS[name](seed=seed, **kwargs)
    except TypeError as err:
        raise ValueError(f"task {name!r}: bad settings {kwargs}: {err}") from err


# ------------------------------------------------------------------------------------------- TRL
SAMPLE_COLUMN = "sample"  # the dataset column holding each prompt's sample (JSON), read back by TaskReward


def prompt_dataset(task: VerifiableTask, start: int, count: int, stream: str = "train") -> Any:
    """Samples `start .. start + count - 1` of a task's stream as a `datasets.Dataset` with TRL's `prompt`
    column and the sample itself (JSON text, so that tasks with nested fields share one schema)."""
    from datasets import Dataset

    samples = task.prompts(start, count, stream)
    return Dataset.from_dict({"prompt": [s["prompt"] for s in samples],
                              SAMPLE_COLUMN: [json.dumps(s) for s in samples]})


class TaskReward:
    """A task's verifiable scorer as a TRL reward function: `reward_funcs=TaskReward(task)` over a
    `prompt_dataset` of the same task. TRL logs it under the task's name."""

    def __init__(self, task: VerifiableTask) -> None:
        self.task = task
        self.__name__ = task.name

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if SAMPLE_COLUMN not in columns:
            raise ValueError(f"TaskReward needs the dataset's {SAMPLE_COLUMN!r} column (build it with prompt_dataset)")
        return [self.task.reward(text, json.loads(sample)) for text, sample in zip(completions, columns[SAMPLE_COLUMN])]


class VariableAssignmentSFT(SFTDataset):
    """Supervised rows for `t2mlr train` (`data.source: factory`): prompt, answer digit, end-of-text, as every
    finetune's rows (`t2mlr.tasks.sft`), without a BOS (the task's tokenizer has none).

    Only the answer and the end-of-text token are scored (labels -100 on the prompt), so the model learns
    what the RL reward checks. Every row of one setting has the same length (each assignment line is four
    symbols), so batches need no padding. `seq_len` is accepted for the trainer and must cover a row.
    """

    def __init__(self, num_samples: int, depth: int = 5, num_constants: int = 3, num_distractors: int = 2,
                 seed: int = 0, seq_len: int = 2048, stream: str = "train") -> None:
        self.task = VariableAssignmentTask(depth, num_constants, num_distractors, seed)
        records = [{"prompt": sample["prompt"], "target": sample["answer"]}
                   for sample in self.task.prompts(0, num_samples, stream)]
        super().__init__(records, self.task.tokenizer, bos=False, max_length=seq_len)


# The `data.factory` entry point (`t2mlr.rl.tasks:variable_assignment_sft`, configs/grpo_va_sft_cpu.yaml).
variable_assignment_sft = VariableAssignmentSFT
