"""What `t2mlr rl grpo` adds to TRL's loop, as transformers `TrainerCallback`s: metrics.jsonl, the greedy accuracy
on the task's held-out stream, and stopping early with a checkpoint (`--stop-after`)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

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


@torch.no_grad()
def greedy_accuracy(model: Any, task: VerifiableTask, tokenizer: Any, settings: Any, max_new_tokens: int) -> dict[str, Any]:
    """The mean reward of greedy completions (prompts tokenized as TRL tokenizes them, completions cut after the
    first end-of-text token), decoded on the exact path."""
    samples = task.prompts(0, settings.num_prompts, "eval")
    device = next(model.parameters()).device
    correct = 0.0
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(samples), settings.batch_size):
            chunk = samples[start : start + settings.batch_size]
            batch = tokenizer([s["prompt"] for s in chunk], padding=True, padding_side="left", return_tensors="pt").to(device)
            out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens, prefill="exact",
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            completions = [cut_after_eos(row, tokenizer.eos_token_id) for row in out[:, batch["input_ids"].shape[1]:].tolist()]
            texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
            correct += sum(task.reward(text, sample) for text, sample in zip(texts, chunk))
    finally:
        model.train(was_training)
    return {"eval_accuracy": correct / len(samples), "eval_prompts": len(samples)}


def cut_after_eos(ids: list[int], eos_token_id: int) -> list[int]:
    """The tokens up to and including the first end-of-text token."""
    return ids[: ids.index(eos_token_id) + 1] if eos_token_id in ids else ids


class StopAfterCallback(TrainerCallback):
    """Stop after optimizer step `step` with a checkpoint (`--resume` continues from it)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
