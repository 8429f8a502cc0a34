"""GRPO on verifiable tasks, with the policy update replayed from the rollout's exact recurrent states.

During an on-policy rollout `generate()` runs the recurrence token by token, so it has already computed
the exact R after every token (`output_recurrent_states=True`). The update then needs no Jacobi
refinement: the Jacobi path starts from those states (`initial_states=`, `exact_states=True`), whose every
iterate is the fixed point, so the middle block runs once and its backward is that of `grpo.replay_depth`
gradient-carrying iterates (`t2mlr.model.fixed_point`): no seed pass, no detached pass, no repeated pass
(docs/semantics.md §5.2, "Replay"). The gradient is the one of truncated BPTT with window `replay_depth`.

The algorithm follows TRL's `GRPOTrainer` (the reference semantics):

* For each of `prompts_per_step` prompts, `group_size` completions are sampled (temperature, top_k).
* Reward: the task's verifiable scorer (1 correct, 0 wrong). Advantage of completion i of a group:
  (r_i − mean(r)) / (std(r) + 1e-4) with the unbiased std (`scale_rewards: false`: not divided).
* Per completion token t: ratio ρ = exp(log π(t) − log π_old(t)); token loss
  −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A), plus β·KL with the estimator
  exp(log π_ref − log π) − (log π_ref − log π) − 1 when `beta > 0` (π_ref: the frozen initial policy).
  With `iterations: 1` π_old is π itself, detached (ρ = 1 in value, gradient of A·log π).
* Log-probabilities use the logits divided by the sampling temperature. Completion tokens count up to and
  including the first end-of-text token.
* `loss_type`: "grpo" (mean over each completion's tokens, then over completions), "bnpo" (mean over all
  completion tokens of the step), "dr_grpo" (sum over tokens / (completions × max_new_tokens)).

Why not TRL itself: its trainer computes log-probabilities with one plain forward of the sequences and
has no place to carry per-token recurrent states from generation into that forward (nor a per-row state
argument in its batches); a T²MLR forward without them would have to re-derive R with a full Jacobi
refinement (or the token-by-token exact path), which is the cost this module exists to avoid. TRL is not
a dependency of this project either.

`iterations > 1` (TRL's μ) reuses each rollout for several updates; from the second update on, the
rollout's states belong to the previous policy, so the replay starts from slightly stale states (the
situation the trainer's `train.warm_start_states` option measures for multi-epoch finetuning) and runs the
iterated Jacobi path, d_forward = d_backward = `replay_depth`, which moves them toward the new fixed point.

Determinism: the prompts of step s are samples s·P .. (s+1)·P − 1 of the task's stream and sampling is
seeded by (train.seed, s), so a resumed run draws what an uninterrupted one draws.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from tqdm.auto import tqdm

from t2mlr.model import is_t2mlr
from t2mlr.model.remote_code import write_remote_code_modules
from t2mlr.training.checkpoint import CheckpointManager, TrainerState, export_model_dir
from t2mlr.training.config import (
    CheckpointConfig,
    ConfigError,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ScheduleConfig,
    apply_overrides,
    from_dict,
    load_yaml_tree,
    resolve_config_path,
    to_plain,
)
from t2mlr.training.distributed import DistEnv, pick_device
from t2mlr.training.metrics import MetricsWriter, read_metrics, setup_logging
from t2mlr.training.optim import build_optimizer, build_scheduler, lr_multiplier
from t2mlr.training.rl_tasks import TASKS, VerifiableTask, build_task

log = logging.getLogger("t2mlr.training.grpo")

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"
CURVE_FILE = "reward.png"
STD_EPS = 1e-4  # TRL's constant in the advantage's denominator


# ------------------------------------------------------------------------------------------- config
@dataclass
class TaskConfig:
    """The verifiable task (`t2mlr.training.rl_tasks.TASKS`) and its generator's settings."""

    name: str = "variable_assignment"
    kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


@dataclass
class GrpoSettings:
    """The algorithm's knobs (TRL's names where TRL has one: num_generations = group_size, μ = iterations)."""

    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 2
    temperature: float = 1.0
    top_k: int = 0
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (symmetric clip)
    beta: float = 0.0
    iterations: int = 1
    loss_type: Literal["grpo", "bnpo", "dr_grpo"] = "grpo"
    scale_rewards: bool = True
    replay_depth: int = 4  # d_forward = d_backward of the replayed update
    micro_batch_size: int = 64  # completions per forward/backward of the update (gradient accumulation)


@dataclass
class RlLoopConfig:
    max_steps: int = 100
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "cpu"


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


def load_grpo_config(name_or_path: str | Path, overrides: list[str] | None = None) -> GrpoConfig:
    """A YAML file or preset (configs/), with dotted overrides; unknown keys and bad values fail here."""
    tree = apply_overrides(load_yaml_tree(resolve_config_path(name_or_path)), list(overrides or []))
    cfg = from_dict(GrpoConfig, tree)
    validate_grpo(cfg)
    return cfg


def validate_grpo(cfg: GrpoConfig) -> None:
    """Cross-field checks that types alone cannot express."""
    if (cfg.policy is None) == (cfg.model is None):
        raise ConfigError("set exactly one of policy (a saved model directory) or model (a fresh model section)")
    if cfg.model is not None and cfg.model.arch != "t2mlr":
        raise ConfigError(f"model.arch must be 't2mlr' (the update replays recurrent states), got {cfg.model.arch!r}")
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
    try:
        build_task(cfg.task.name, cfg.task.seed, **cfg.task.kwargs)
    except ValueError as err:
        raise ConfigError(f"task: {err}") from err


# ------------------------------------------------------------------------------------------- the math
def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True) -> torch.Tensor:
    """(r − group mean) / (group std + 1e-4), rows grouped consecutively; unbiased std as TRL."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    return centred.reshape(-1)


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 for completion tokens up to and including the first end-of-text token, 0 after it."""
    is_eos = completion_ids == eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).float()


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log π(token) under softmax(logits / temperature), in float32 at least."""
    scaled = logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def clipped_token_losses(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, epsilon_low: float,
    epsilon_high: float, ref_log_probs: torch.Tensor | None = None, beta: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token GRPO loss (see the module docstring), the KL term and whether the clip was active."""
    ratio = torch.exp(log_probs - old_log_probs)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages[:, None]
    losses = -torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros_like(losses)
    if ref_log_probs is not None and beta > 0:
        delta = ref_log_probs - log_probs
        kl = torch.exp(delta) - delta - 1
        losses = losses + beta * kl
    clip_active = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    return losses, kl, clip_active


def token_weights(mask: torch.Tensor, loss_type: str, max_new_tokens: int) -> torch.Tensor:
    """Weights w with loss = Σ w · token_loss over the whole step, so micro-batches add up exactly."""
    rows = mask.shape[0]
    if loss_type == "grpo":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0) / rows
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return mask / (rows * max_new_tokens)
    raise ValueError(f"loss_type must be grpo, bnpo or dr_grpo, got {loss_type!r}")


# ------------------------------------------------------------------------------------------- rollouts
@dataclass
class Rollout:
    """One step's sampled completions with everything the update needs."""

    samples: list[dict[str, Any]]  # the prompts' task samples (one per group)
    sequences: torch.Tensor  # (P·G, prompt + generated)
    attention_mask: torch.Tensor  # the prompt's padding mask, ones over generated tokens
    states: torch.Tensor  # (P·G, prompt + generated, hidden): exact R from generate()
    prompt_length: int
    mask: torch.Tensor  # (P·G, generated): completion tokens that count
    completions: list[str]
    rewards: torch.Tensor  # (P·G,)
    advantages: torch.Tensor  # (P·G,)
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length:]


def encode_prompts(tokenizer: Any, samples: list[dict[str, Any]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask (decoder-only generation continues from the right end)."""
    tokenizer.padding_side = "left"
    batch = tokenizer([s["prompt"] for s in samples], add_special_tokens=False, padding=True, return_tensors="pt")
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def decode_completions(tokenizer: Any, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The text of each completion, without the end-of-text token and what follows it."""
    texts = []
    for ids, keep in zip(completion_ids.tolist(), mask.tolist()):
        kept = [i for i, k in zip(ids, keep) if k and i != tokenizer.eos_token_id]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts


@torch.no_grad()
def sample_rollout(model: Any, task: VerifiableTask, tokenizer: Any, samples: list[dict[str, Any]],
                   settings: GrpoSettings, seed: int) -> Rollout:
    """`group_size` sampled completions per prompt, their exact states, rewards and advantages."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, samples, device)
    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    try:
        out = model.generate(
            prompt_ids, attention_mask=prompt_mask, do_sample=True, temperature=settings.temperature,
            top_k=settings.top_k, top_p=1.0, max_new_tokens=settings.max_new_tokens,
            num_return_sequences=settings.group_size, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, return_dict_in_generate=True, output_recurrent_states=True,
            prefill="exact",
        )
    finally:
        model.train(was_training)
    sequences, length = out.sequences, prompt_ids.shape[1]
    completion_ids = sequences[:, length:]
    mask = completion_mask(completion_ids, tokenizer.eos_token_id)
    generated = torch.ones_like(completion_ids)
    attention = torch.cat([prompt_mask.repeat_interleave(settings.group_size, 0), generated], dim=1)
    completions = decode_completions(tokenizer, completion_ids, mask)
    owners = [samples[i // settings.group_size] for i in range(len(completions))]
    rewards = torch.tensor([task.reward(text, sample) for text, sample in zip(completions, owners)], dtype=torch.float32)
    advantages = group_advantages(rewards, settings.group_size, settings.scale_rewards)
    return Rollout(samples, sequences, attention, out.recurrent_states, length, mask, completions, rewards, advantages)


def replay_log_probs(model: Any, rollout: Rollout, rows: slice, depth: int, temperature: float,
                     exact: bool = True) -> torch.Tensor:
    """log π of the completion tokens of `rows`, from a Jacobi forward that starts at the rollout's states
    (d_forward = d_backward = depth: no seed pass, no detached pass). `exact`: the states are the current
    policy's (one middle-block pass); False once the policy has moved since the rollout (iterated path)."""
    out = model(
        input_ids=rollout.sequences[rows], attention_mask=rollout.attention_mask[rows], recurrence="jacobi",
        initial_states=rollout.states[rows], d_forward=depth, d_backward=depth, exact_states=exact,
    )
    logits = out.logits[:, rollout.prompt_length - 1 : -1]
    return token_log_probs(logits, rollout.completion_ids[rows], temperature)


@torch.no_grad()
def exact_log_probs(model: Any, rollout: Rollout, rows: slice, temperature: float) -> torch.Tensor:
    """log π of the completion tokens on the exact path (for a model whose states the rollout does not hold:
    the frozen reference)."""
    out = model(input_ids=rollout.sequences[rows], attention_mask=rollout.attention_mask[rows], recurrence="exact")
    return token_log_probs(out.logits[:, rollout.prompt_length - 1 : -1], rollout.completion_ids[rows], temperature)


def row_slices(rows: int, micro: int) -> list[slice]:
    return [slice(start, min(start + micro, rows)) for start in range(0, rows, micro)]


# ------------------------------------------------------------------------------------------- the loop
@dataclass
class UpdateStats:
    loss: float
    kl: float
    clip_fraction: float
    grad_norm: float


class GrpoTrainer:
    """Owns the policy, its frozen reference (when beta > 0), the optimizer and the run directory."""

    def __init__(self, cfg: GrpoConfig, out_dir: str | Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.out_dir, True)
        self.env = DistEnv(device=pick_device(cfg.train.device))
        self.task = build_task(cfg.task.name, cfg.task.seed, **cfg.task.kwargs)
        torch.manual_seed(cfg.train.seed)
        self.model, self.tokenizer = self._build_policy()
        self.reference = None
        if cfg.grpo.beta > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule, cfg.train.max_steps)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.checkpoints = CheckpointManager(self.out_dir / CHECKPOINT_DIR, self.env, cfg.checkpoint.keep_last)
        self.metrics = MetricsWriter(self.out_dir, True, cfg.logging.tensorboard)
        self.step = 0
        self.completions_seen = 0
        self.last_checkpoint: Path | None = None
        self._start_or_resume(resume)

    def _build_policy(self) -> tuple[Any, Any]:
        from t2mlr.training.model_factory import build_model
        from t2mlr.utils import load_tokenizer

        cfg = self.cfg
        if cfg.policy is not None:
            from t2mlr import T2MLRForCausalLM

            model = T2MLRForCausalLM.from_pretrained(cfg.policy)
            tokenizer = load_tokenizer(cfg.policy) if (Path(cfg.policy) / "tokenizer_config.json").is_file() else self.task.tokenizer
        else:
            model, tokenizer = build_model(cfg.model), self.task.tokenizer
        if not is_t2mlr(model):
            raise ConfigError(f"the policy must be a T²MLR model (its update replays recurrent states), got {type(model).__name__}")
        if len(tokenizer) > model.config.vocab_size:
            raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is {model.config.vocab_size}")
        return model.to(self.env.device).train(), tokenizer

    def _start_or_resume(self, resume: bool) -> None:
        existing = self.checkpoints.latest()
        if existing is not None and not resume:
            raise FileExistsError(f"{self.out_dir} already holds checkpoints (newest: {existing.name}); pass --resume "
                                  "to continue it or choose another --out")
        saved = self.out_dir / CONFIG_FILE
        if resume and saved.is_file():
            changed = differing_keys(yaml.safe_load(saved.read_text(encoding="utf-8")), self.cfg.to_dict())
            if changed:
                raise ConfigError(f"{self.out_dir} was started with a different configuration ({', '.join(changed)}); "
                                  "resume with the recorded one")
        found = self.checkpoints.resume(self.model, self.optimizer, self.scheduler) if resume else None
        if found is not None:
            self.last_checkpoint, state = found
            self.step, self.completions_seen = state.step, state.tokens_seen
            log.info("resumed from %s (step %d)", self.last_checkpoint, self.step)
        self.metrics.truncate_after(self.step)
        saved.write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False), encoding="utf-8")
        log.info("GRPO on %s: %d prompts × %d completions per step, update replayed at depth %d",
                 self.task.name, self.cfg.grpo.prompts_per_step, self.cfg.grpo.group_size, self.cfg.grpo.replay_depth)

    # ------------------------------------------------------------------------------------ one step
    def step_samples(self, step: int) -> list[dict[str, Any]]:
        """The prompts of optimizer step `step` (0-based)."""
        count = self.cfg.grpo.prompts_per_step
        return self.task.prompts(step * count, count, "train")

    def collect(self, step: int) -> Rollout:
        """Sample the rollout of step `step` and, where needed, the log-probs of π_old and π_ref."""
        g = self.cfg.grpo
        rollout = sample_rollout(self.model, self.task, self.tokenizer, self.step_samples(step), g,
                                 seed=self.cfg.train.seed * 1_000_003 + step)
        slices = row_slices(rollout.sequences.shape[0], g.micro_batch_size)
        if g.iterations > 1:
            with torch.no_grad():
                rollout.old_log_probs = torch.cat([replay_log_probs(self.model, rollout, rows, 1, g.temperature)
                                                   for rows in slices])
        if self.reference is not None:
            rollout.ref_log_probs = torch.cat([exact_log_probs(self.reference, rollout, rows, g.temperature)
                                               for rows in slices])
        return rollout

    def policy_loss(self, rollout: Rollout, rows: slice, weights: torch.Tensor,
                    states_exact: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This micro-batch's share of the step's loss, its KL and clip terms (weighted like the loss).
        `states_exact`: the policy has not been updated since the rollout."""
        g = self.cfg.grpo
        log_probs = replay_log_probs(self.model, rollout, rows, g.replay_depth, g.temperature, states_exact)
        old = log_probs.detach() if rollout.old_log_probs is None else rollout.old_log_probs[rows]
        ref = None if rollout.ref_log_probs is None else rollout.ref_log_probs[rows]
        epsilon_high = g.epsilon if g.epsilon_high is None else g.epsilon_high
        losses, kl, clipped = clipped_token_losses(log_probs, old, rollout.advantages[rows].to(log_probs.device),
                                                   g.epsilon, epsilon_high, ref, g.beta)
        w = weights[rows].to(losses.device)
        return (losses * w).sum(), (kl.detach() * w).sum(), (clipped.float() * w).sum()

    def update(self, rollout: Rollout) -> UpdateStats:
        """`iterations` optimizer steps on one rollout (TRL's μ); the last one's statistics."""
        g = self.cfg.grpo
        weights = token_weights(rollout.mask, g.loss_type, g.max_new_tokens)
        norm = weights.sum().clamp(min=1e-12)  # KL and clip fraction: averages with the loss's weights
        stats = UpdateStats(0.0, 0.0, 0.0, 0.0)
        for iteration in range(g.iterations):
            loss_sum = kl_sum = clip_sum = 0.0
            for rows in row_slices(rollout.sequences.shape[0], g.micro_batch_size):
                loss, kl, clipped = self.policy_loss(rollout, rows, weights, states_exact=iteration == 0)
                loss.backward()
                loss_sum, kl_sum, clip_sum = loss_sum + float(loss.detach()), kl_sum + float(kl), clip_sum + float(clipped)
            if not math.isfinite(loss_sum):
                raise FloatingPointError(f"non-finite GRPO loss at step {self.step + 1}; lower optim.lr")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip or float("inf")))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            stats = UpdateStats(loss_sum, kl_sum / float(norm), clip_sum / float(norm), grad_norm)
        self.scheduler.step()
        return stats

    # ------------------------------------------------------------------------------------ run
    def train(self, stop_after: int | None = None) -> list[dict[str, Any]]:
        """Run to train.max_steps (or stop with a checkpoint after step `stop_after`); the step records."""
        cfg = self.cfg
        end = cfg.train.max_steps if stop_after is None else min(stop_after, cfg.train.max_steps)
        records: list[dict[str, Any]] = []
        if self.step == 0 and cfg.eval.every > 0:
            self._write({"split": "eval", "step": 0, **self.evaluate()})
        bar = tqdm(total=cfg.train.max_steps, initial=self.step, disable=not cfg.logging.progress_bar,
                   desc=cfg.logging.progress_label or "grpo", dynamic_ncols=True)
        try:
            while self.step < end:
                record = self.train_step()
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", loss=f"{record['loss']:.4f}")
                if cfg.eval.every > 0 and self.step % cfg.eval.every == 0:
                    evaluation = {"split": "eval", "step": self.step, **self.evaluate()}
                    self._write(evaluation)
                    log.info("step %d eval accuracy %.3f", self.step, evaluation["eval_accuracy"])
                if cfg.checkpoint.every > 0 and self.step % cfg.checkpoint.every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
        finished = self.step >= cfg.train.max_steps
        if (cfg.checkpoint.save_final or not finished) and self._checkpoint_step() != self.step:
            self.save_checkpoint()
        if finished and cfg.checkpoint.save_final and self.last_checkpoint is not None:
            export_model_dir(self.last_checkpoint, self.out_dir / FINAL_DIR)
        if finished:
            plot_grpo_run(self.out_dir)
        self.metrics.close()
        return records

    def train_step(self) -> dict[str, Any]:
        started = time.perf_counter()
        lr = self.cfg.optim.lr * lr_multiplier(self.step, self.cfg.schedule, self.cfg.train.max_steps)
        rollout = self.collect(self.step)
        sampled = time.perf_counter()
        stats = self.update(rollout)
        done = time.perf_counter()
        self.step += 1
        self.completions_seen += rollout.sequences.shape[0]
        groups = rollout.rewards.view(-1, self.cfg.grpo.group_size)
        record = {
            "split": "train", "step": self.step, "reward_mean": float(rollout.rewards.mean()),
            "reward_std": float(rollout.rewards.std()), "groups_without_signal": float((groups.std(dim=1) == 0).float().mean()),
            "completion_tokens": float(rollout.mask.sum(dim=1).mean()), "loss": stats.loss, "kl": stats.kl,
            "clip_fraction": stats.clip_fraction, "grad_norm": stats.grad_norm, "lr": lr,
            "rollout_s": sampled - started, "update_s": done - sampled, "replay_depth": self.cfg.grpo.replay_depth,
        }
        self._write(record)
        return record

    def _write(self, record: dict[str, Any]) -> None:
        if record.get("split") == "eval" or self.step % max(1, self.cfg.logging.every) == 0:
            self.metrics.write(record)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Greedy accuracy on the first eval.num_prompts samples of the task's "eval" stream."""
        cfg, device = self.cfg, self.env.device
        samples = self.task.prompts(0, cfg.eval.num_prompts, "eval")
        correct = 0.0
        self.model.eval()
        try:
            for start in range(0, len(samples), cfg.eval.batch_size):
                chunk = samples[start : start + cfg.eval.batch_size]
                ids, mask = encode_prompts(self.tokenizer, chunk, device)
                out = self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=cfg.grpo.max_new_tokens,
                                          pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
                                          prefill="exact")
                completion = out[:, ids.shape[1]:]
                texts = decode_completions(self.tokenizer, completion, completion_mask(completion, self.tokenizer.eos_token_id))
                correct += sum(self.task.reward(text, sample) for text, sample in zip(texts, chunk))
        finally:
            self.model.train()
        return {"eval_accuracy": correct / len(samples), "eval_prompts": len(samples)}

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        state = TrainerState(step=self.step, tokens_seen=self.completions_seen, world_size=1,
                             global_batch_size=self.cfg.grpo.prompts_per_step * self.cfg.grpo.group_size,
                             torch_threads=torch.get_num_threads())
        extra = {CONFIG_FILE: yaml.safe_dump(self.cfg.to_dict(), sort_keys=False),
                 "config.json": self.model.config.to_json_string()}

        def write_model_files(directory: Path) -> None:
            self.tokenizer.save_pretrained(str(directory))
            write_remote_code_modules(directory)

        self.last_checkpoint = self.checkpoints.save(self.model, self.optimizer, self.scheduler, state,
                                                     extra_files=extra, write_extra=write_model_files)
        log.info("step %d: checkpoint %s", self.step, self.last_checkpoint)
        return self.last_checkpoint

    def _checkpoint_step(self) -> int | None:
        return None if self.last_checkpoint is None else int(self.last_checkpoint.name.split("_")[-1])


RESUME_NEUTRAL = ("logging", "checkpoint", "eval", "train.max_steps")


def differing_keys(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, except those that do not change the run's result."""
    if isinstance(saved, dict) and isinstance(current, dict):
        keys: list[str] = []
        for key in sorted(set(saved) | set(current)):
            keys += differing_keys(saved.get(key), current.get(key), f"{prefix}{key}.")
        return keys
    name = prefix.rstrip(".")
    if saved == current or any(name == n or name.startswith(n + ".") for n in RESUME_NEUTRAL):
        return []
    return [name]


def plot_grpo_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Mean reward per step (and its running mean over 10 steps) with the greedy eval accuracy, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(Path(run_dir))
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    steps = [r["step"] for r in train]
    rewards = [r["reward_mean"] for r in train]
    ax.plot(steps, rewards, color="0.75", lw=0.8, label="mean reward (sampled, per step)")
    window = 10
    smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
    ax.plot(steps, smooth, color="C0", lw=1.6, label=f"running mean ({window} steps)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "o-", color="C3", label="greedy eval accuracy")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(out) if out is not None else Path(run_dir) / CURVE_FILE
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_grpo(cfg: GrpoConfig, out_dir: str | Path, resume: bool = False, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Build a GrpoTrainer and run it; the step records."""
    return GrpoTrainer(cfg, out_dir, resume=resume).train(stop_after)


__all__ = [
    "GrpoConfig", "GrpoSettings", "GrpoTrainer", "Rollout", "clipped_token_losses", "completion_mask",
    "group_advantages", "load_grpo_config", "plot_grpo_run", "replay_log_probs", "run_grpo", "sample_rollout",
    "token_log_probs", "token_weights",
]
