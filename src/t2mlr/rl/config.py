"""The `t2mlr rl grpo` config: its sections as dataclasses, read by the trainer's loader (`extends:`, dotted
overrides, typo errors), in a module that loads neither torch nor TRL, so a config error is reported at once
(`check_grpo_before_loading`); `t2mlr.rl.grpo` checks the rest and runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from t2mlr.training.config import (
    CheckpointConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ScheduleConfig,
    from_dict,
    load_tree,
    to_plain,
)

__all__ = ["GrpoConfig", "GrpoSettings", "RlEvalConfig", "RlLoopConfig", "TaskConfig", "check_grpo_before_loading"]


@dataclass
class TaskConfig:
    """The verifiable task (`t2mlr.rl.tasks.TASKS`) and its generator's settings."""

    name: str = "variable_assignment"
    kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


@dataclass
class GrpoSettings:
    """The algorithm's knobs, in TRL's terms where the names differ: group_size = num_generations,
    max_new_tokens = max_completion_length, iterations = num_iterations (μ), micro_batch_size =
    per_device_train_batch_size. `scale_rewards`: divide the advantages by the group's std (TRL's "group")
    or not ("none")."""

    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 2
    temperature: float = 1.0
    top_k: int = 0
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (symmetric clip)
    beta: float = 0.0
    iterations: int = 1
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    scale_rewards: bool = True
    replay_depth: int = 4  # d_backward of the replayed update (its BPTT window)
    micro_batch_size: int = 64  # completions per forward/backward and process
    gradient_checkpointing: bool = False


@dataclass
class RlLoopConfig:
    max_steps: int = 100
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass
class RlEvalConfig:
    """Greedy accuracy on the task's "eval" stream every `every` steps (0: never), and before step 1."""

    every: int = 0
    num_prompts: int = 64
    batch_size: int = 64


@dataclass
class GrpoConfig:
    """A GRPO run. The policy is either `policy` (a saved model directory: a `t2mlr train` run's final/ or
    checkpoint, with its tokenizer) or `model` (a trainer `model:` section: a fresh model, for tests and
    smoke runs; the task's tokenizer is used)."""

    policy: str | None = None
    model: ModelConfig | None = None
    task: TaskConfig = field(default_factory=TaskConfig)
    grpo: GrpoSettings = field(default_factory=GrpoSettings)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(kind="constant"))
    train: RlLoopConfig = field(default_factory=RlLoopConfig)
    eval: RlEvalConfig = field(default_factory=RlEvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def check_grpo_before_loading(name_or_path: str | Path, overrides: list[str] | None = None) -> None:
    """Every key and type but the `model:` section's (the architecture's keys, read from the model's config
    class), before torch loads: a typo is reported in a fraction of a second."""
    tree = load_tree(name_or_path, overrides)
    from_dict(GrpoConfig, {key: value for key, value in tree.items() if key != "model"})
