"""The training loop: plain PyTorch, one process or torchrun (DDP / FSDP2).

Loss normalisation: every step's loss is the sum of token losses over the *global* batch divided by
the global number of scored tokens. Each micro-batch's mean loss is re-weighted by its share of the
global token count, so gradient accumulation and any number of ranks give the same update as one
process holding the whole batch (up to float summation order).

Exact resume by construction: the data position is the step count (the sampler is a pure function
of it), the DataLoader draws from its own generator instead of the global RNG, evaluation runs inside
`fork_rng`, and a checkpoint stores every generator state after the step it records. The learning-rate
schedule's length comes from the run's recorded configuration: a resume whose configuration differs
in anything that changes the result (the schedule's length included) is refused, naming the keys,
unless explicitly allowed. Stopping early (`stop_after`) does not touch the configuration. A run
resumed from step k therefore replays steps k+1.. bit for bit on the same hardware.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from tqdm.auto import tqdm

from t2mlr.baselines.matching import count_parameters
from t2mlr.model import is_t2mlr
from t2mlr.model.modeling import ExactSolveReport
from t2mlr.model.pretrained import (
    IncompatibleBaseError,
    check_vocab_size,
    load_pretrained_tokenizer,
)
from t2mlr.model.remote_code import write_remote_code_modules
from t2mlr.training import distributed as dist_utils
from t2mlr.training.architectures import get_architecture
from t2mlr.training.checkpoint import CheckpointManager, TrainerState, export_model_dir
from t2mlr.training.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    TrainConfig,
    changed_settings,
    save_config,
    to_plain,
    with_current_factories,
)
from t2mlr.training.data import (
    Collator,
    ResumableBatchSampler,
    StepBatches,
    build_dataset,
    count_targets,
    eval_batches,
    labels_aligned,
)
from t2mlr.training.distributed import DistEnv
from t2mlr.training.metrics import MetricsWriter, optimizer_step_seconds, read_metrics, setup_logging
from t2mlr.training.model_factory import (
    PLAIN_FORWARD,
    RECURRENCE_ONLY_INPUTS,
    base_config,
    build_model,
    decoder_layers,
    describe_path,
    gate_values,
    repeated_block_indices,
)
from t2mlr.training.optim import build_optimizer, build_scheduler, lr_multiplier
from t2mlr.training.warm_states import WarmStartStore
from t2mlr.utils import cpu_arithmetic, load_tokenizer

log = logging.getLogger("t2mlr.training")

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"  # the finished run's model directory: weights, config and tokenizer


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient norm; the last good checkpoint was kept."""


@dataclass
class TrainResult:
    """What a finished (or stopped) run reports back."""

    out_dir: Path
    step: int
    losses: list[float] = field(default_factory=list)
    last_checkpoint: Path | None = None
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    step_seconds: float = 0.0  # time in optimizer steps over every attempt (checkpoints and evaluation left out)


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    tokens: int
    jacobi_iterations: float | None
    lr: float
    warm_started: float | None = None  # share of micro-batches started from stored states (warm_start_states)
    d_forward: int | None = None  # the step's drawn Jacobi depth (model.d_forward_sampling)
    recurrent_weight: float | None = None  # the step's λ (train.recurrent_weight_curriculum)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _mean_iterations(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


class Trainer:
    """Owns the model, optimizer, data and checkpoints of one run. `train()` runs the loop."""

    def __init__(
        self, cfg: TrainConfig, out_dir: str | Path, resume: bool = False, allow_config_change: bool = False,
    ) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.allow_config_change = allow_config_change
        self.env = dist_utils.init_distributed(cfg.train.parallel, cfg.train.device)
        if self.env.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        dist_utils.barrier(self.env)
        setup_logging(self.out_dir, self.env.is_main)
        _check_batch_split(cfg, self.env)
        self._build_data()  # first: bad data fail before a model is built (it draws no random numbers)
        self._build_model()
        self.warm_states = WarmStartStore(self.model.config) if cfg.train.warm_start_states else None
        self._row_sampler = self._sampler(0)  # a pure function of (step, micro): the rows of every micro-batch
        self.checkpoints = CheckpointManager(self.out_dir / CHECKPOINT_DIR, self.env, cfg.checkpoint.keep_last)
        self.metrics = MetricsWriter(self.out_dir, self.env.is_main, cfg.logging.tensorboard)
        self.step = 0
        self.tokens_seen = 0
        self.step_seconds = 0.0  # carried in checkpoints, so an interrupted and resumed run loses none of it
        self.last_checkpoint: Path | None = None
        self._start_or_resume()
        self.batches = StepBatches(self.train_set, self._sampler(self.step), self.collator, cfg.data.num_workers)

    # ------------------------------------------------------------------------------------ setup
    def _build_model(self) -> None:
        cfg, env = self.cfg, self.env
        seed_all(cfg.train.seed)  # identical initial weights on every rank
        model = build_model(cfg.model).to(env.device)
        layers = decoder_layers(model)
        self.recurrent = is_t2mlr(model)
        # the path the model takes in training mode; the trainer never passes one (only eval overrides)
        self.train_recurrence = model.config.forward_path(True).recurrence if self.recurrent else "none"
        self.eval_overrides = {} if cfg.eval.recurrence is None else {"recurrence": cfg.eval.recurrence}
        unused = self.train_recurrence == "off"
        self.wrapped = dist_utils.wrap_model(model, env, cfg.train.parallel, layers, repeated_block_indices(model), unused)
        self.model = dist_utils.unwrap(self.wrapped)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule, cfg.horizon())
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.gates = gate_values(self.model)
        seed_all(cfg.train.seed + 1_000_003 * env.rank)  # per-rank stream for dropout and the like
        self.autocast = self._autocast_context()

    def _autocast_context(self) -> Any:
        """bf16 autocast on CUDA when supported (precision=auto) or asked for; float32 otherwise."""
        precision, device = self.cfg.train.precision, self.env.device
        auto_bf16 = precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.precision = "bf16" if precision == "bf16" or auto_bf16 else "fp32"
        if self.precision == "fp32":
            return contextlib.nullcontext
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def _build_data(self) -> None:
        cfg = self.cfg
        model_config = base_config(cfg.model)
        if cfg.model.pretrained is not None:
            check_pretrained_settings(cfg.model, model_config)
        vocab_size = model_config.vocab_size  # token ids are checked against it
        self.train_set = build_dataset(cfg.data, vocab_size=vocab_size, name="data")
        self.tokenizer = run_tokenizer(self.train_set, cfg.data, cfg.model, vocab_size)
        self.collator = Collator(cfg.data.pad_token_id, labels_aligned(self.train_set, cfg.data))
        self.eval_data: list[dict[str, torch.Tensor]] = []
        if cfg.eval.every > 0 and cfg.eval.data is not None:
            self.eval_data = eval_batches(cfg.eval.data, vocab_size, cfg.eval.batch_size, cfg.eval.max_batches,
                                          self.env.rank, self.env.world_size)

    def _sampler(self, start_step: int) -> ResumableBatchSampler:
        t = self.cfg.train
        return ResumableBatchSampler(
            len(self.train_set), t.global_batch_size, t.micro_batch_size, seed=self.cfg.data.seed,
            rank=self.env.rank, world_size=self.env.world_size, start_step=start_step,
        )

    def _start_or_resume(self) -> None:
        existing = self.checkpoints.latest()
        if existing is not None and not self.resume:
            raise FileExistsError(
                f"{self.out_dir} already holds checkpoints (newest: {existing.name}); pass --resume to continue "
                "it or choose another --out"
            )
        found = None
        if self.resume:
            self._check_config_against_saved()
            found = self.checkpoints.resume(self.wrapped, self.optimizer, self.scheduler)
        if found is not None:
            self.last_checkpoint, state = found
            self.step, self.tokens_seen = state.step, state.tokens_seen
            self.step_seconds = self._recorded_step_seconds(state)
            self.metrics.truncate_after(self.step)
            log.info("resumed from %s (step %d, %d tokens seen)", self.last_checkpoint, self.step, self.tokens_seen)
            if self.env.device.type == "cpu":
                for change in arithmetic_changes(state):
                    log.warning("the checkpoint was written on %s: the float sums add up in another order, so the "
                                "steps from here will not match an uninterrupted run bit for bit", change)
            if self.warm_states is not None:
                self.warm_states.load(self.last_checkpoint)
        else:
            if self.resume:
                log.info("--resume: no checkpoint in %s yet, starting from step 0", self.out_dir)
            self.metrics.truncate_after(0)  # records of an earlier attempt that never checkpointed
        if self.env.is_main:
            save_config(self.cfg, self.out_dir / CONFIG_FILE)
        self._log_setup()

    def _recorded_step_seconds(self, state: TrainerState) -> float:
        """The optimizer steps' time up to the resumed checkpoint: its own record, or (a checkpoint of an older
        version, which kept none) the estimate from the step records up to it (an interrupted attempt may have
        logged past it), on the rank that writes them."""
        if state.step_seconds is not None:
            return state.step_seconds
        if not self.metrics.path.is_file():
            return 0.0
        return optimizer_step_seconds(r for r in read_metrics(self.out_dir) if r.get("step", 0) <= state.step)

    def _check_config_against_saved(self) -> None:
        """Refuse to continue a run under a configuration that would change its result."""
        path = self.out_dir / CONFIG_FILE
        if not path.is_file():
            return
        changes = result_changing_differences(yaml.safe_load(path.read_text(encoding="utf-8")), self.cfg)
        if not changes:
            return
        listing = "\n  ".join(changes)
        if self.allow_config_change:
            log.warning("resuming with a changed configuration (allowed); the result will differ from an "
                        "uninterrupted run:\n  %s", listing)
            return
        raise ResumeMismatchError(
            f"{self.out_dir} was started with a different configuration:\n  {listing}\n"
            "Resume with the recorded configuration (the same config and overrides; stop early with --stop-after, "
            "which leaves the schedule alone), or pass --allow-config-change to continue anyway."
        )

    def _log_setup(self) -> None:
        t, env = self.cfg.train, self.env
        log.info("model: %s, %.2fM parameters", type(self.model).__name__, count_parameters(self.model) / 1e6)
        log.info("train forward path: %s (the model's choice)", describe_path(self.model, True))
        if self.cfg.model.d_forward_sampling is not None:
            depths = self.cfg.model.d_forward_sampling.depths(self.model.config.d_forward)
            log.info("Jacobi depth drawn per step from %s (model.d_forward_sampling)", depths)
        curriculum = t.recurrent_weight_curriculum
        if curriculum is not None:
            log.info("recurrent weight λ (Φ reads λ·R) from %g to %g over %d steps, %s "
                     "(train.recurrent_weight_curriculum)", curriculum.start, curriculum.end, curriculum.steps, curriculum.schedule)
        log.info("eval forward path: %s (the model's choice%s)",
                 describe_path(self.model, False, self.eval_overrides.get("recurrence")),
                 ", with eval.recurrence" if self.eval_overrides else "")
        log.info(
            "device %s, precision %s, parallel %s × %d rank(s); global batch %d = micro %d × accum %d × %d",
            env.device, self.precision, t.parallel if env.distributed else "none", env.world_size,
            t.global_batch_size, t.micro_batch_size, self._row_sampler.accum_steps, env.world_size,
        )
        log.info("schedule: %s over %d steps (warmup %d), training to step %d",
                 self.cfg.schedule.kind, self.cfg.horizon(), self.cfg.schedule.warmup_steps, t.max_steps)

    # ------------------------------------------------------------------------------------ loop
    def train(self, stop_after: int | None = None) -> TrainResult:
        """Run until train.max_steps, or stop (with a checkpoint) once `stop_after` steps are done; the
        schedule stays the one of train.max_steps, so `--resume` continues exactly. Raises
        NonFiniteLossError (after logging it) on NaN/inf."""
        cfg = self.cfg
        if stop_after is not None and stop_after < 1:
            raise ValueError(f"stop_after must be >= 1, got {stop_after}")
        end = cfg.train.max_steps if stop_after is None else min(stop_after, cfg.train.max_steps)
        result = TrainResult(self.out_dir, self.step, last_checkpoint=self.last_checkpoint)
        show = self.env.is_main and cfg.logging.progress_bar
        bar = tqdm(total=cfg.train.max_steps, initial=self.step, disable=not show, dynamic_ncols=True,
                   desc=cfg.logging.progress_label or None, position=cfg.logging.progress_line)
        self.wrapped.train()
        try:
            while self.step < end and not self.out_of_time():
                started = time.perf_counter()
                stats = self.train_step(next(self.batches))
                elapsed = time.perf_counter() - started
                self.step += 1
                self.step_seconds += elapsed
                self.tokens_seen += stats.tokens
                result.losses.append(stats.loss)
                self._after_step(stats, elapsed, bar, result)
        finally:
            bar.close()
            self.metrics.close()
        finished = self.step >= cfg.train.max_steps or self.out_of_time()
        if (cfg.checkpoint.save_final or not finished) and self.last_checkpoint_step() != self.step:
            self.save_checkpoint()
        if finished and cfg.checkpoint.save_final and self.env.is_main:
            export_model_dir(self.last_checkpoint, self.out_dir / FINAL_DIR)
            log.info("model ready: %s (t2mlr generate / t2mlr eval / from_pretrained)", self.out_dir / FINAL_DIR)
        elif not finished:
            log.info("stopped after step %d of %d; continue with --resume", self.step, cfg.train.max_steps)
        result.step, result.last_checkpoint, result.step_seconds = self.step, self.last_checkpoint, self.step_seconds
        return result

    def out_of_time(self) -> bool:
        """The time budget (train.max_seconds) is spent: its optimizer steps, over every attempt, took that long."""
        budget = self.cfg.train.max_seconds
        return budget is not None and self.step_seconds >= budget

    def _after_step(self, stats: StepStats, elapsed: float, bar: Any, result: TrainResult) -> None:
        cfg = self.cfg
        tokens_per_s = stats.tokens / max(elapsed, 1e-9)
        bar.update(1)
        bar.set_postfix(loss=f"{stats.loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
        if self.step % max(1, cfg.logging.every) == 0 or self.step == cfg.train.max_steps or self.out_of_time():
            self.metrics.write(self._train_record(stats, tokens_per_s))
        if cfg.eval.every > 0 and self.step % cfg.eval.every == 0:
            result.eval_metrics = self.evaluate()
            self.metrics.write({"split": "eval", "step": self.step, **result.eval_metrics})
            log.info("step %d eval: %s", self.step, _format(result.eval_metrics))
        if cfg.checkpoint.every > 0 and self.step % cfg.checkpoint.every == 0:
            self.save_checkpoint()

    def _train_record(self, stats: StepStats, tokens_per_s: float) -> dict[str, Any]:
        record: dict[str, Any] = {
            "split": "train", "step": self.step, "loss": stats.loss,
            "lr": stats.lr, "grad_norm": stats.grad_norm, "tokens_per_s": tokens_per_s, "tokens_seen": self.tokens_seen,
            "step_seconds": self.step_seconds,
            "recurrence": self.train_recurrence, "jacobi_iterations": stats.jacobi_iterations,
        }
        if stats.warm_started is not None:
            record["warm_started"] = stats.warm_started
        if stats.d_forward is not None:
            record["d_forward"] = stats.d_forward
        if stats.recurrent_weight is not None:
            record["recurrent_weight"] = stats.recurrent_weight
        for name, param in self.gates.items():
            record[name] = float(dist_utils.full_value(param.detach()).float())
        return record

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> StepStats:
        """One optimizer step over this rank's micro-batches of a global batch."""
        env, device = self.env, self.env.device
        if env.distributed and dist_utils.is_sharded(self.wrapped):
            micro_batches = self._common_widths(micro_batches)
        local_targets = [count_targets(b) for b in micro_batches]
        local_tokens = sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
                           for b in micro_batches)
        totals = dist_utils.all_reduce(torch.tensor([sum(local_targets), local_tokens], dtype=torch.float64), env)
        global_targets, global_tokens = int(totals[0]), int(totals[1])
        if global_targets == 0:
            raise ValueError(f"step {self.step + 1}: the global batch has no scored tokens (all labels are -100)")
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        iterations: list[int | None] = []
        warm: list[bool] = []
        depth = self._drawn_depth()
        weight = self._weigh_recurrence(self.step + 1)
        for index, (batch, n_targets) in enumerate(zip(micro_batches, local_targets)):
            last = index == len(micro_batches) - 1
            inputs = self._model_inputs(batch, depth)
            if self.warm_states is not None:
                rows = self._row_sampler.micro_batch(self.step, index)
                inputs.update(self.warm_states.forward_inputs(rows, batch["input_ids"].shape[1], device))
                warm.append("initial_states" in inputs)
            with dist_utils.grad_sync(self.wrapped, enabled=last):
                with self.autocast():
                    out = self.wrapped(**inputs)
                if self.warm_states is not None:
                    self.warm_states.remember(rows, inputs["past_key_values"])
                if n_targets:
                    scaled = out.loss * (n_targets * env.world_size / global_targets)
                    loss_sum += out.loss.detach().double() * n_targets
                else:  # keeps every parameter in the graph so DDP/FSDP hooks still fire
                    scaled = out.logits.sum() * 0.0
                scaled.backward()
            iterations.append(getattr(out, "jacobi_iterations", None))
        self._weigh_recurrence(None)  # evaluation and checkpoints read R at weight 1
        dist_utils.sync_replicated_grads(self.wrapped, env)
        loss = float(dist_utils.all_reduce(loss_sum, env)) / global_targets
        self._check_finite(loss, "loss")
        grad_norm = float(dist_utils.clip_grad_norm(self.params, self.cfg.optim.grad_clip, env))
        self._check_finite(grad_norm, "gradient norm")
        lr = self.cfg.optim.lr * lr_multiplier(self.step, self.cfg.schedule, self.cfg.horizon())
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        warm_share = sum(warm) / len(warm) if warm else None
        return StepStats(loss, grad_norm, global_tokens, _mean_iterations(iterations), lr, warm_share,
                         depth.get("d_forward"), weight)

    def _weigh_recurrence(self, step: int | None) -> float | None:
        """Set the weight λ with which Φ reads R for training step `step` (train.recurrent_weight_curriculum, a
        function of the step alone), or back to none (`step` None); returns λ (None without a curriculum)."""
        curriculum = self.cfg.train.recurrent_weight_curriculum
        weight = None if curriculum is None or step is None else curriculum.value(step)
        if curriculum is not None:
            self.model.model.recurrent_weight = weight
        return weight

    def _drawn_depth(self) -> dict[str, int]:
        """The forward's depth arguments of the step about to run, drawn when model.d_forward_sampling is set (from
        the seed and the step number: a resumed run draws what an uninterrupted one would); empty otherwise."""
        sampling = self.cfg.model.d_forward_sampling
        if sampling is None:
            return {}
        config = self.model.config
        depth = sampling.draw(config.d_forward, self.cfg.train.seed, self.step + 1)
        return {"d_forward": depth, "d_backward": min(config.d_backward, depth)}

    def _common_widths(self, micro_batches: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """FSDP: each micro-batch padded to the widest of the ranks' at its micro-step (`Collator.widen`; the
        padding is masked, so the step's result is unchanged), so that every rank runs the same forward."""
        widths = torch.tensor([batch["input_ids"].shape[1] for batch in micro_batches], dtype=torch.long)
        common = dist_utils.all_reduce(widths.to(self.env.device), self.env, "max").tolist()
        return [self.collator.widen(batch, width) for batch, width in zip(micro_batches, common)]

    def _model_inputs(self, batch: dict[str, torch.Tensor], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Batch tensors on the device plus the run's path overrides; a model without recurrence does not
        get the recurrence-only inputs a T²MLR dataset may carry, and runs without a cache (`PLAIN_FORWARD`)."""
        device = self.env.device
        keep = {k: v for k, v in batch.items() if self.recurrent or k not in RECURRENCE_ONLY_INPUTS}
        plain = {} if self.recurrent else PLAIN_FORWARD
        return {**{k: v.to(device, non_blocking=True) for k, v in keep.items()}, **plain, **(overrides or {})}

    def eval_recurrence(self) -> str:
        if not self.recurrent:
            return "none"
        return self.model.config.forward_path(False, self.eval_overrides.get("recurrence")).recurrence

    def _check_finite(self, value: float, what: str) -> None:
        if math.isfinite(value):
            return
        self.optimizer.zero_grad(set_to_none=True)
        kept = (f"the last good checkpoint {self.last_checkpoint} (latest) is kept"
                if self.last_checkpoint else "no checkpoint had been written yet")
        message = (f"non-finite {what} ({value}) at step {self.step + 1}; training stopped before the update, "
                   f"{kept}. Lower optim.lr, enable gradient clipping, or check the data.")
        log.error(message)
        self.metrics.write({"split": "train", "step": self.step + 1, "event": "non_finite", "what": what,
                            "value": value})
        raise NonFiniteLossError(message)

    # ------------------------------------------------------------------------------------ eval
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Mean token loss over the fixed eval set with the configured eval path (named in the result)."""
        device = self.env.device
        devices = [device.index] if device.type == "cuda" else []
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        targets = 0
        iterations: list[int | None] = []
        solves: list[Any] = []
        self.wrapped.eval()
        try:
            with torch.random.fork_rng(devices=devices):
                for batch in self.eval_data:
                    n = count_targets(batch)
                    with self.autocast():
                        out = self.wrapped(**self._model_inputs(batch, self.eval_overrides))
                    if n:
                        loss_sum += out.loss.double() * n
                    targets += n
                    iterations.append(getattr(out, "jacobi_iterations", None))
                    solves.append(getattr(out, "exact_solve", None))
        finally:
            self.wrapped.train()
        totals = dist_utils.all_reduce(
            torch.stack([loss_sum, torch.tensor(float(targets), dtype=torch.float64, device=device)]), self.env)
        eval_loss = float(totals[0] / totals[1]) if totals[1] > 0 else float("nan")
        return {
            "eval_loss": eval_loss,
            "eval_ppl": math.exp(eval_loss) if eval_loss < 50 else float("inf"),
            "eval_recurrence": self.eval_recurrence(),
            "eval_jacobi_iterations": _mean_iterations(iterations),
            "eval_exact_solve": ExactSolveReport.combined(solves),  # this rank's forwards
            "eval_tokens": int(totals[1]),
        }

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        state = TrainerState(step=self.step, tokens_seen=self.tokens_seen, world_size=self.env.world_size,
                             global_batch_size=self.cfg.train.global_batch_size, step_seconds=self.step_seconds,
                             **cpu_arithmetic())
        extra = {
            CONFIG_FILE: yaml.safe_dump(self.cfg.to_dict(), sort_keys=False),
            "config.json": self.model.config.to_json_string(),  # with model.safetensors: from_pretrained works
        }
        path = self.checkpoints.save(self.wrapped, self.optimizer, self.scheduler, state, extra_files=extra,
                                     write_extra=self._write_model_files)
        self.last_checkpoint = path
        log.info("step %d: checkpoint %s", self.step, path)
        return path

    def _write_model_files(self, directory: Path) -> None:
        """What loading the checkpoint as a model needs beyond weights and config: the tokenizer, and the
        small modules that let transformers find T²MLR without `import t2mlr` (trust_remote_code)."""
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(directory))
        if self.recurrent:
            write_remote_code_modules(directory)
        if self.warm_states is not None:
            self.warm_states.save(directory)

    def last_checkpoint_step(self) -> int | None:
        if self.last_checkpoint is None:
            return None
        return int(self.last_checkpoint.name.split("_")[-1])


def _check_batch_split(cfg: TrainConfig, env: DistEnv) -> None:
    t = cfg.train
    if t.global_batch_size % (t.micro_batch_size * env.world_size):
        raise ConfigError(
            f"train.global_batch_size {t.global_batch_size} is not a multiple of train.micro_batch_size "
            f"{t.micro_batch_size} × {env.world_size} rank(s); change one of them"
        )


def run_tokenizer(
    dataset: Any, data: DataConfig, model: ModelConfig | None = None, vocab_size: int | None = None
) -> Any:
    """The run's tokenizer, saved with every checkpoint (so `t2mlr generate` / `t2mlr eval` take them):
    the dataset's own (S5, synthetic), the one data.tokenizer names, else the pretrained model's own
    (a GGUF's included); None when the data are token ids only. With `vocab_size`, a tokenizer with
    more tokens than the model's vocabulary is refused here, before any training."""
    tokenizer = getattr(dataset, "tokenizer", None)
    if tokenizer is None and data.tokenizer:
        tokenizer = load_tokenizer(data.tokenizer)
    if tokenizer is None and model is not None and model.pretrained is not None:
        tokenizer = load_pretrained_tokenizer(model.pretrained, model.gguf_file)
    if tokenizer is not None and vocab_size is not None:
        try:
            check_vocab_size(tokenizer, vocab_size)
        except IncompatibleBaseError as err:
            raise ConfigError(f"model.pretrained {model.pretrained if model else ''}: {err}") from err
    return tokenizer


def check_pretrained_settings(model: ModelConfig, config: Any) -> None:
    """The architecture's settings (l_start/l_end, loop blocks, ...) against the pretrained model's config,
    read before its weights: `l_end` beyond its layers is a ConfigError, not a failure after loading."""
    try:
        get_architecture(model.arch).check(config, model.settings)
    except ValueError as err:
        raise ConfigError(f"model (pretrained {model.pretrained!r}): {err}") from err


class ResumeMismatchError(ConfigError):
    """A resume under a configuration that would change the run's result."""


RESULT_NEUTRAL = ("logging", "checkpoint", "eval", "data.num_workers", "train.max_steps", "train.max_seconds",
                  "schedule.total_steps")


def result_changing_differences(saved: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """`key: saved → current` for every setting that would make a resumed run differ from an
    uninterrupted one. Logging, checkpointing and evaluation do not change the training result;
    train.max_steps and schedule.total_steps matter through the schedule's length only, and train.max_seconds
    says where the run ends, as max_steps does."""
    changes = changed_settings(with_current_factories(saved), to_plain(cfg), RESULT_NEUTRAL)
    saved_total = (saved.get("schedule") or {}).get("total_steps") or (saved.get("train") or {}).get("max_steps")
    if saved_total != cfg.horizon():
        changes.append(f"the schedule's length: {saved_total} → {cfg.horizon()} steps (train.max_steps, "
                       "schedule.total_steps)")
    return changes


def arithmetic_changes(state: TrainerState) -> list[str]:
    """How this process computes on the CPU differently from the one that wrote `state`: another torch thread
    count or another kernel set (AVX2 against AVX512: another CPU). The run still continues, but no longer
    replays an uninterrupted one, and nothing else would say so. Unrecorded values (older checkpoints) are
    not compared."""
    what = {"torch_threads": "torch CPU thread(s)", "cpu_kernels": "CPU kernels"}
    return [f"{getattr(state, key)} {what[key]}, this attempt runs on {value}" for key, value in cpu_arithmetic().items()
            if getattr(state, key) is not None and getattr(state, key) != value]


def _format(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def train(
    cfg: TrainConfig, out_dir: str | Path, resume: bool = False, stop_after: int | None = None,
    allow_config_change: bool = False,
) -> TrainResult:
    """Build a Trainer and run it (see `Trainer.train` for `stop_after`). A process group this call
    created is left again, also on errors."""
    owns_group = not (dist.is_available() and dist.is_initialized())
    try:
        return Trainer(cfg, out_dir, resume=resume, allow_config_change=allow_config_change).train(stop_after)
    finally:
        if owns_group:
            dist_utils.shutdown_distributed()
