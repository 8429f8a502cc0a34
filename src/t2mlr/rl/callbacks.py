"""What `t2mlr rl grpo` adds to TRL's loop, as transformers `TrainerCallback`s: metrics.jsonl, the greedy accuracy
on the task's held-out stream, and stopping early with a checkpoint (`--stop-after`)."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from t2mlr.generation.text import GenerationSettings, generate_batched

from t2mlr.rl.tasks import VerifiableTask
from t2mlr.training.metrics import MetricsWriter


class MetricsCallback(TrainerCallback):
    """Each logged training step as a metrics.jsonl record: TRL's metrics under their names, plus update_s (the
    step's time less its rollout's, `step_time - rollout_s`; steps that reuse a rollout log no reward)."""

    def __init__(self, metrics: MetricsWriter) -> None:
        self.metrics = metrics
        self.records: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:  # the end-of-training summary, or an evaluation
            return
        record = {"split": "train", "step": state.global_step, **logs}
        if "step_time" in logs:  # a step that reuses a rollout (num_iterations > 1) has no rollout_s
            record["update_s"] = logs["step_time"] - logs.get("rollout_s", 0.0)
        self.records.append(record)
        if state.is_world_process_zero:
            self.metrics.write(record)


class GreedyEvalCallback(TrainerCallback):
    """Greedy accuracy (the task's reward) on the first `num_prompts` samples of its "eval" stream, before the
    first step and every `every` steps (0: never), on the main process."""

    def __init__(self, task: VerifiableTask, tokenizer: Any, settings: Any, max_new_tokens: int,
                 metrics: MetricsWriter) -> None:
        self.task, self.tokenizer, self.settings = task, tokenizer, settings
        self.max_new_tokens, self.metrics = max_new_tokens, metrics

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.settings.every > 0 and state.global_step == 0 and state.is_world_process_zero:
            self._write(state.global_step, model)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.settings.every > 0 and state.global_step % self.settings.every == 0 and state.is_world_process_zero:
            self._write(state.global_step, model)

    def _write(self, step: int, model: Any) -> None:
        self.metrics.write({"split": "eval", "step": step, **greedy_accuracy(model, self.task, self.tokenizer,
                                                                              self.settings, self.max_new_tokens)})


def greedy_accuracy(model: Any, task: VerifiableTask, tokenizer: Any, settings: Any, max_new_tokens: int) -> dict[str, Any]:
    """The mean reward of greedy completions on the exact path, through the library's one batched generator,
    with the prompts encoded as TRL encodes them (the tokenizer's own special tokens)."""
    samples = task.prompts(0, settings.num_prompts, "eval")
    texts = generate_batched(model, tokenizer, [s["prompt"] for s in samples],
                             GenerationSettings(max_new_tokens=max_new_tokens, prefill="exact"), settings.batch_size,
                             bos=None, desc="greedy eval")
    correct = sum(task.reward(text, sample) for text, sample in zip(texts, samples))
    return {"eval_accuracy": correct / len(samples), "eval_prompts": len(samples)}


class StopAfterCallback(TrainerCallback):
    """Stop after optimizer step `step` with a checkpoint (`--resume` continues from it)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
