"""What `t2mlr experiment` reads before torch loads: each experiment's preset names and config files, and the
`task:` section of its presets as pure data, checked when a preset is read (a typo or a bad value answers at once,
with the valid choices). The experiments themselves (`s5`, `finetune`, `pathfinding`, `retrofit`, `pretrain`,
`s5_evidence`) are heavy modules that import these sections; `commands` loads one of them only once its preset and
overrides have been checked.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from t2mlr.evaluation.generation import SamplingPlan
from t2mlr.tasks.arithmetic import ArithmeticSettings

__all__ = ["DESIGNS", "FinetuneTask", "PathfindingTask", "PretrainTask", "RetrofitTask", "S5Task", "Variant", "preset_config", "presets"]

EXPERIMENT_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "experiments"
PRETRAIN_ARMS = ("t2mlr_middle", "t2mlr_full", "transformer")  # the pretraining comparison's arms


def presets(experiment: str) -> tuple[str, ...]:
    """The preset names of an experiment's configs (`s5_cpu_deep.yaml` → "cpu-deep"), read from the file names."""
    found = (path.stem.removeprefix(f"{experiment}_") for path in EXPERIMENT_CONFIGS.glob(f"{experiment}_*.yaml"))
    return tuple(sorted(name.replace("_", "-") for name in found))


def preset_config(experiment: str, preset: str, task: str | None = None) -> str:
    """The config of a preset, as `t2mlr train` names it (`preset_config("s5", "cpu-deep")` →
    experiments/s5_cpu_deep; a finetune's also names its task: experiments/finetune_cpu_prosqa_hard)."""
    words = [experiment, preset] + ([task] if task is not None else [])
    return "experiments/" + "_".join(word.replace("-", "_") for word in words)


# ------------------------------------------------------------------------------------------ the task sections


@dataclass(frozen=True)
class S5Task:
    """The task section of an S5 config (`task:`): the data and what the baselines and threads are."""

    k: int  # key length: each dictionary entry is a permutation and its k value symbols
    dict_size: int
    alphabet: str
    train_n: tuple[int, int]  # numbers of actions N, uniform in this range, for training
    eval_n: tuple[int, int]  # ... and evaluated one by one
    train_size: int  # training rows (streamed, each drawn once per epoch); >= steps × batch means all fresh
    eval_size_per_n: int
    num_actions: int | None = None  # None: actions from all of S5 (the paper); m: a seeded generating set of size m
    lstm_layers: int = 4  # layers of every recurrent baseline (LSTM, GRU, RNN)
    baseline_steps: int | None = None  # the baselines' training steps (None: T²MLR's train.max_steps)
    # torch CPU threads of every run and of the evaluation (part of the arithmetic, see the module docstring)
    torch_threads: int = 1
    # `transformer:compute-matched` trains round(ratio × T²MLR's steps) steps: T²MLR's training-step time over
    # the matched Transformer's, measured side by side (t2mlr.analysis.costs); None: not measured, refused
    compute_matched_ratio: float | None = None
    compute_matched_basis: str = ""
    notes: str = ""  # printed in results.md: how the preset departs from the paper, and why

    def __post_init__(self) -> None:
        if self.train_n[1] > self.eval_n[1]:
            raise ValueError(f"task.eval_n {list(self.eval_n)} must reach the training lengths {list(self.train_n)}")
        if self.torch_threads < 1:
            raise ValueError(f"task.torch_threads must be >= 1, got {self.torch_threads}")
        if self.compute_matched_ratio is not None and self.compute_matched_ratio <= 0:
            raise ValueError("task.compute_matched_ratio must be > 0 or null")

    def max_length(self) -> int:
        """Tokens in the longest evaluation row (dictionary, delimiter, actions, the trailing <eos>)."""
        return self.dict_size * (self.k + 1) + 1 + self.eval_n[1] * (self.k + 1) + 1


@dataclass(frozen=True)
class FinetuneTask:
    """The task section of a finetune config (`task:`)."""

    name: Literal["variable-assignment", "prosqa-hard", "gsm-aug", "hotpotqa"]
    arms: tuple[str, ...]  # `t2mlr params` spellings: t2mlr:13-18, transformer, looped:9-22:3, pause:2
    train_size: int  # training records (0: every record of the data)
    eval_size: int  # held-out problems
    settings: dict[str, Any] = field(default_factory=dict)  # the generator's keyword arguments
    max_new_tokens: int = 8
    max_length: int = 1024  # training rows longer than this are left out (counted in the results)
    prefill: Literal["exact", "jacobi"] = "exact"  # T²MLR's prompt in evaluation
    start: Literal["scratch", "from", "retrofit"] = "scratch"  # where the arms start unless the command line says
    notes: str = ""
    samples: int = 1  # replies per problem: 1 is greedy, more are sampled (temperature, top_p)
    pass_k: tuple[int, ...] = (1,)  # the pass@k reported; every k <= samples
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.eval_size < 1 or self.max_new_tokens < 1 or self.max_length < 2 or not self.arms:
            raise ValueError("task: eval_size and max_new_tokens must be >= 1, max_length >= 2, arms not empty")
        try:
            self.sampling()
        except ValueError as err:
            raise ValueError(f"task: {err}") from err

    def sampling(self) -> SamplingPlan:
        return SamplingPlan(self.samples, tuple(self.pass_k), self.temperature, self.top_p)


@dataclass(frozen=True)
class PathfindingTask(FinetuneTask):
    """The task section of a pathfinding config (`task:`): a finetune task section naming the pathfinding task,
    plus the pretrained model a retrofit preset starts from."""

    name: Literal["pathfinding"]
    pretrained: str | None = None  # hub id or local directory; used when start is "retrofit"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start == "retrofit" and not self.pretrained:
            raise ValueError("task: start retrofit needs task.pretrained (the model to retrofit)")
        if self.start == "from":
            raise ValueError("task: a pathfinding preset starts from scratch or retrofits task.pretrained")


@dataclass(frozen=True)
class RetrofitTask:
    """The task section of a retrofit config (`task:`)."""

    train_data: Literal["arithmetic", "openmathreasoning"]
    eval_data: Literal["arithmetic", "gsm8k", "math500"]
    train_problems: int  # rows generated (arithmetic) or read (at most, from train_path)
    eval_problems: int | None  # generated, or read from eval_path (None: every row of the file)
    max_length: int  # longest training row (prompt + reply) in tokens
    max_new_tokens: int
    train_path: str | None = None  # local file for openmathreasoning
    eval_path: str | None = None  # local file for gsm8k and math500
    arithmetic: ArithmeticSettings = field(default_factory=ArithmeticSettings)

    def __post_init__(self) -> None:
        for name in ("train_problems", "max_length", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_problems is None and self.eval_data == "arithmetic":
            raise ValueError("generated evaluation problems need a count: task.eval_problems must be >= 1, got None")
        if self.eval_problems is not None and self.eval_problems < 1:
            raise ValueError(f"task.eval_problems must be >= 1 (or null: every row of --eval-path), got {self.eval_problems}")
        if self.train_data == "openmathreasoning" and not self.train_path:
            raise ValueError("train_data 'openmathreasoning' needs --train-path: a local jsonl/parquet file with the "
                             "dataset's columns problem, generated_solution, expected_answer (nvidia/OpenMathReasoning)")
        if self.eval_data == "gsm8k" and not self.eval_path:
            raise ValueError("eval_data 'gsm8k' needs --eval-path: a local jsonl/parquet file with GSM8K's columns "
                             "question, answer (openai/gsm8k, split test)")
        if self.eval_data == "math500" and not self.eval_path:
            raise ValueError("eval_data 'math500' needs --eval-path: a local jsonl/parquet file with MATH-500's "
                             "columns problem, answer (HuggingFaceH4/MATH-500, split test)")
        if self.eval_data == "math500" and importlib.util.find_spec("math_verify") is None:
            raise ValueError("eval_data 'math500' is scored by math-verify too: pip install math-verify (or the "
                             "t2mlr[eval] extra)")


@dataclass(frozen=True)
class PretrainTask:
    """The task section of a pretraining config (`task:`)."""

    sources: tuple[str, ...] = ("python-docs",)  # offline corpus sources (t2mlr.corpus.offline)
    python_sources: str | None = None  # the folder of the python-sources source (None: the installed packages)
    max_train_documents: int | None = None  # tokenize at most this many train documents (None: all)
    tokenizer_documents: int | None = None  # train the BPE on the first this many train documents (None: all)
    tokenize_workers: int = 1  # processes tokenizing the corpus
    arms: tuple[str, ...] = PRETRAIN_ARMS  # which of ARMS to train
    eval_batches: int = 8  # held-out batches of eval.batch_size rows for the final table
    exact_eval_batches: int | None = None  # of those, scored on T²MLR's exact path too (None: all; 0: none)

    def __post_init__(self) -> None:
        unknown = [arm for arm in self.arms if arm not in PRETRAIN_ARMS]
        if unknown or not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"task.arms must be distinct names among {', '.join(PRETRAIN_ARMS)}, got {list(self.arms)}")
        for name in ("max_train_documents", "tokenizer_documents"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be >= 1 (or null: all), got {getattr(self, name)}")
        if self.tokenize_workers < 1:
            raise ValueError(f"task.tokenize_workers must be >= 1, got {self.tokenize_workers}")
        if self.exact_eval_batches is not None and not 0 <= self.exact_eval_batches <= self.eval_batches:
            raise ValueError(f"task.exact_eval_batches must lie in 0..task.eval_batches ({self.eval_batches}), "
                             f"got {self.exact_eval_batches}")


# ------------------------------------------------------------------------------------------ the S5 evidence study

# The arms of the study, fixed before any result. T²MLR(1,2) is the `cpu` (and `tiny`) preset's placement.
MAIN_ARMS = (
    "t2mlr",  # the preset's path: exact
    "t2mlr:1-2:jacobi:16:4",
    "t2mlr:1-2:jacobi:4:2",
    "transformer",
    "transformer:compute-matched",
    "looped:full:2",
    "pause:2",
    "looped:full:3",  # looped ×3 over T²MLR's block range (1-2), which on 2 blocks is every block
)
DEEP_ARMS = ("t2mlr", "looped:2-3:3", "transformer")  # T²MLR(2,3) exact on 4 blocks


@dataclass(frozen=True)
class Variant:
    """One backbone of the study: a preset and the arms trained on it."""

    preset: str
    arms: tuple[str, ...]


DESIGNS: dict[str, tuple[Variant, ...]] = {
    "cpu": (Variant("cpu", MAIN_ARMS), Variant("cpu-deep", DEEP_ARMS)),
    "tiny": (Variant("tiny", MAIN_ARMS), Variant("tiny-deep", DEEP_ARMS)),  # a pipeline check: numbers mean nothing
}
