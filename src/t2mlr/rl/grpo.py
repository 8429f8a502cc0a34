"""`t2mlr rl grpo`: GRPO on a verifiable task with `T2MLRGRPOTrainer` (TRL's trainer, the update replayed from
the rollout's exact recurrent states), from one YAML config.

The config names the policy (a saved model directory, or a fresh model section), the task (`t2mlr.rl.tasks`),
the GRPO settings, the optimizer and schedule (the library's own AdamW parameter groups and LR schedule, handed
to TRL), the loop, the greedy evaluation and the checkpoints. This module translates it into a `T2MLRGRPOConfig`
and adds what TRL does not do: the task's prompts and rewards, the greedy accuracy on the task's held-out
stream, metrics.jsonl, the reward curve, the run directory's rules (no silent overwrite; `--resume` only with
the recorded configuration) and `--stop-after`.

Batches: each optimizer step samples `prompts_per_step` prompts (the task's stream in order, so step s reads
prompts s·P .. (s+1)·P − 1 when `iterations` is 1) with `group_size` completions each, and scores them in
chunks of `micro_batch_size` completions per process (TRL's per-device batch; gradient accumulation makes up
the rest). `iterations` is TRL's μ: each rollout serves μ optimizer steps, and `train.max_steps` counts
optimizer steps.

Run directory: config.yaml, train.log, metrics.jsonl (every logged step: TRL's metrics under their TRL names —
reward, reward_std, frac_reward_zero_std, loss, grad_norm, entropy, kl, clip_ratio/*, completions/*,
learning_rate, step_time — plus rollout_s and update_s; greedy eval accuracy), checkpoints/checkpoint-N
(transformers' format, resumed by `--resume`), final/ and reward.png.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from transformers.trainer_utils import get_last_checkpoint

from t2mlr.model import T2MLRForCausalLM, is_t2mlr
from t2mlr.rl.callbacks import GreedyEvalCallback, MetricsCallback, StopAfterCallback
from t2mlr.rl.config import GrpoConfig, GrpoSettings
from t2mlr.rl.tasks import TASKS, TaskReward, VerifiableTask, build_task, prompt_dataset
from t2mlr.rl.trainer import T2MLRGRPOConfig, T2MLRGRPOTrainer
from t2mlr.training.config import ConfigError, changed_settings, from_dict, load_tree
from t2mlr.training.metrics import MetricsWriter, read_metrics, setup_logging
from t2mlr.training.model_factory import build_model
from t2mlr.training.optim import build_optimizer, build_scheduler
from t2mlr.training.plot import pyplot, save_figure
from t2mlr.utils import load_tokenizer

log = logging.getLogger("t2mlr.rl.grpo")

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"
INITIAL_DIR = "initial_policy"  # a fresh policy saved before training, where TRL loads the frozen reference from
CURVE_FILE = "reward.png"


# ------------------------------------------------------------------------------------------- config
def load_grpo_config(name_or_path: str | Path, overrides: list[str] | None = None) -> GrpoConfig:
    """A YAML file or preset (configs/), with dotted overrides; unknown keys and bad values fail here."""
    cfg = from_dict(GrpoConfig, load_tree(name_or_path, overrides))
    validate_grpo(cfg)
    return cfg


def validate_grpo(cfg: GrpoConfig) -> None:
    """Cross-field checks that types alone cannot express."""
    if (cfg.policy is None) == (cfg.model is None):
        raise ConfigError("set exactly one of policy (a saved model directory) or model (a fresh model section)")
    if cfg.model is not None and cfg.model.arch != "t2mlr":
        raise ConfigError(f"model.arch must be 't2mlr' (the update replays recurrent states), got {cfg.model.arch!r}")
    if cfg.model is not None and cfg.model.d_forward_sampling is not None:
        raise ConfigError("model.d_forward_sampling draws the Jacobi depth of `t2mlr train` steps; the GRPO update "
                          "replays exact states (grpo.replay_depth), so remove it")
    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name must be one of {list(TASKS)}, got {cfg.task.name!r}")
    g = cfg.grpo
    for name in ("prompts_per_step", "group_size", "max_new_tokens", "iterations", "replay_depth", "micro_batch_size"):
        if getattr(g, name) < 1:
            raise ConfigError(f"grpo.{name} must be >= 1, got {getattr(g, name)}")
    if g.group_size < 2:
        raise ConfigError(f"grpo.group_size must be >= 2 (advantages compare completions of a group), got {g.group_size}")
    if g.temperature <= 0 or g.top_k < 0 or g.beta < 0 or g.epsilon <= 0 or (g.epsilon_high is not None and g.epsilon_high <= 0):
        raise ConfigError("grpo: need temperature > 0, top_k >= 0, beta >= 0, epsilon > 0 and epsilon_high > 0")
    if cfg.train.max_steps < 1 or cfg.eval.every < 0 or cfg.eval.num_prompts < 1 or cfg.eval.batch_size < 1:
        raise ConfigError("train.max_steps >= 1, eval.every >= 0, eval.num_prompts >= 1 and eval.batch_size >= 1")
    if cfg.schedule.total_steps is not None:
        raise ConfigError("schedule.total_steps is not used by `t2mlr rl grpo` (the schedule spans train.max_steps)")
    batch_layout(cfg.grpo, world_size=1)
    try:
        build_task(cfg.task.name, cfg.task.seed, **cfg.task.kwargs)
    except ValueError as err:
        raise ConfigError(f"task: {err}") from err


def batch_layout(g: GrpoSettings, world_size: int) -> tuple[int, int]:
    """(per-device batch, gradient-accumulation steps) that score one step's prompts_per_step × group_size
    completions in chunks of at most micro_batch_size per process."""
    rows = g.prompts_per_step * g.group_size
    if rows % world_size:
        raise ConfigError(f"prompts_per_step × group_size = {rows} completions do not split over {world_size} processes")
    per_device = min(g.micro_batch_size, rows // world_size)
    if (rows // world_size) % per_device:
        raise ConfigError(f"grpo.micro_batch_size={g.micro_batch_size} must divide the {rows // world_size} completions "
                          f"each of the {world_size} process(es) scores per step")
    return per_device, rows // world_size // per_device


# ------------------------------------------------------------------------------------------- resume rules
RESUME_NEUTRAL = ("logging", "checkpoint", "eval", "train.max_steps")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """transformers' newest checkpoint-N folder of a run, if any."""
    folder = run_dir / CHECKPOINT_DIR
    found = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    return None if found is None else Path(found)


def check_run_directory(run_dir: Path, cfg: GrpoConfig, resume: bool) -> Path | None:
    """The checkpoint to resume from (None: a fresh start); refuses to overwrite a run, or to resume it with a
    configuration that would change its result."""
    existing = latest_checkpoint(run_dir)
    if existing is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds checkpoints (newest: {existing.name}); pass --resume to "
                              "continue it or choose another --out")
    saved = run_dir / CONFIG_FILE
    if resume and saved.is_file():
        changed = changed_settings(yaml.safe_load(saved.read_text(encoding="utf-8")), cfg.to_dict(), RESUME_NEUTRAL)
        if changed:
            raise ConfigError(f"{run_dir} was started with a different configuration ({'; '.join(changed)}); "
                              "resume with the recorded one")
    return existing if resume else None


# ------------------------------------------------------------------------------------------- the run
def build_policy(cfg: GrpoConfig, task: VerifiableTask, run_dir: Path) -> tuple[Any, Any]:
    """The policy and its tokenizer. A fresh policy with a KL term is saved first (INITIAL_DIR) and loaded back,
    so that TRL can load the frozen reference from the policy's path as it does for any model."""
    if cfg.policy is not None:
        model = T2MLRForCausalLM.from_pretrained(cfg.policy)
        has_tokenizer = (Path(cfg.policy) / "tokenizer_config.json").is_file()
        tokenizer = load_tokenizer(cfg.policy) if has_tokenizer else task.tokenizer
    else:
        torch.manual_seed(cfg.train.seed)
        model, tokenizer = build_model(cfg.model), task.tokenizer
        if cfg.grpo.beta > 0:
            model.save_pretrained(run_dir / INITIAL_DIR)
            model = T2MLRForCausalLM.from_pretrained(run_dir / INITIAL_DIR)
    if not is_t2mlr(model):
        raise ConfigError(f"the policy must be a T²MLR model (its update replays recurrent states), got {type(model).__name__}")
    if len(tokenizer) > model.config.vocab_size:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is {model.config.vocab_size}")
    return model.train(), tokenizer


def trainer_arguments(cfg: GrpoConfig, run_dir: Path, world_size: int) -> Any:
    """The `T2MLRGRPOConfig` of a run."""
    g, ckpt = cfg.grpo, cfg.checkpoint
    per_device, accumulation = batch_layout(g, world_size)
    return T2MLRGRPOConfig(
        output_dir=str(run_dir / CHECKPOINT_DIR),
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
        num_generations=g.group_size, max_completion_length=g.max_new_tokens, temperature=g.temperature,
        top_k=g.top_k, top_p=1.0, epsilon=g.epsilon, epsilon_high=g.epsilon_high, beta=g.beta,
        num_iterations=g.iterations, loss_type=g.loss_type, scale_rewards="group" if g.scale_rewards else "none",
        replay_depth=g.replay_depth, gradient_checkpointing=g.gradient_checkpointing,
        max_grad_norm=cfg.optim.grad_clip or 0.0, max_steps=cfg.train.max_steps, seed=cfg.train.seed,
        use_cpu=cfg.train.device == "cpu", bf16=cfg.train.precision == "bf16",
        shuffle_dataset=False,  # the task's stream in order, as the prompts are numbered
        save_strategy="steps" if ckpt.every > 0 else "no", save_steps=max(ckpt.every, 1),
        save_total_limit=ckpt.keep_last, logging_steps=cfg.logging.every, disable_tqdm=not cfg.logging.progress_bar,
        report_to=["tensorboard"] if cfg.logging.tensorboard else "none",
    )


def run_grpo(cfg: GrpoConfig, out_dir: str | Path, resume: bool = False, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Train to train.max_steps (or stop with a checkpoint after step `stop_after`); the train records written."""
    run_dir = Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    world_size, is_main = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")) == 0
    setup_logging(run_dir, is_main)
    checkpoint = check_run_directory(run_dir, cfg, resume)
    task = build_task(cfg.task.name, cfg.task.seed, **cfg.task.kwargs)
    model, tokenizer = build_policy(cfg, task, run_dir)
    args = trainer_arguments(cfg, run_dir, world_size)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.schedule, cfg.train.max_steps)
    rollouts = math.ceil(cfg.train.max_steps / cfg.grpo.iterations)
    metrics = MetricsWriter(run_dir, is_main, tensorboard=False)
    metrics.truncate_after(-1 if checkpoint is None else int(checkpoint.name.rsplit("-", 1)[-1]))  # -1: a fresh file
    if is_main:
        (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    recorder = MetricsCallback(metrics)
    callbacks = [recorder, GreedyEvalCallback(task, tokenizer, cfg.eval, cfg.grpo.max_new_tokens, metrics)]
    if stop_after is not None and stop_after < cfg.train.max_steps:
        callbacks.append(StopAfterCallback(stop_after))
    trainer = T2MLRGRPOTrainer(
        model=model, reward_funcs=TaskReward(task), args=args, processing_class=tokenizer,
        train_dataset=prompt_dataset(task, 0, rollouts * cfg.grpo.prompts_per_step, "train"),
        optimizers=(optimizer, scheduler), callbacks=callbacks,
    )
    log.info("GRPO on %s: %d prompts × %d completions per step, update replayed from the rollout's states "
             "(depth %d)", task.name, cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.grpo.replay_depth)
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    finished = trainer.state.global_step >= cfg.train.max_steps
    if finished and cfg.checkpoint.save_final:
        trainer.save_model(str(run_dir / FINAL_DIR))
    if finished and is_main:
        plot_grpo_run(run_dir)
    metrics.close()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return recorder.records


def plot_grpo_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Mean reward per step (and its running mean over 10 steps) with the greedy eval accuracy, to a PNG."""
    records = read_metrics(Path(run_dir))
    train = [r for r in records if r.get("split") == "train" and "reward" in r]  # steps that sampled a rollout
    evals = [r for r in records if r.get("split") == "eval"]
    fig, ax = pyplot().subplots(figsize=(6.4, 3.8))
    steps = [r["step"] for r in train]
    rewards = [r["reward"] for r in train]
    ax.plot(steps, rewards, color="0.75", lw=0.8, label="mean reward (sampled, per step)")
    window = 10
    smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
    ax.plot(steps, smooth, color="C0", lw=1.6, label=f"running mean ({window} steps)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "o-", color="C3", label="greedy eval accuracy")
    ax.set(xlabel="GRPO step", ylabel="reward / accuracy", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, Path(out) if out is not None else Path(run_dir) / CURVE_FILE)


__all__ = ["GrpoConfig", "GrpoSettings", "batch_layout", "load_grpo_config", "plot_grpo_run", "run_grpo",
           "trainer_arguments"]
