"""The reasoning finetunes (paper §4.3, Figure "finetuning-multihop"): every arm on one task, pass@1.

`run_finetune(plan, out)` does what `t2mlr experiment finetune TASK` promises:

1. data: training and held-out evaluation records (`t2mlr.experiments.finetune_tasks`) written to
   OUT/data (train.jsonl, eval.jsonl, the tokenizer, meta.json);
2. one training run per arm with the project trainer, all with the same data, order, steps, optimiser and
   seed; rows are SFT rows with the prompt masked from the loss (`t2mlr.experiments.finetune_data`); on a
   CPU the arms train side by side in worker processes (`t2mlr.experiments.concurrent_runs`);
3. evaluation: greedy generation through `generate()` in batches with left padding (T²MLR: exact prefill
   unless the plan says Jacobi), scored by the task's extractor;
4. OUT/results.md, OUT/results.json, OUT/pass_at_1.png and OUT/predictions.jsonl (one line per arm and
   problem: prompt, gold, generated text, extracted answer, correct, and what the scorer needs), which
   `rescore_predictions` turns back into the reported pass@1.

Starting points: from scratch (a small Llama whose non-T²MLR arms are parameter-matched to T²MLR,
`t2mlr.baselines.matched_arms`), each arm's own checkpoint (`--from`, checked against the arm before any
training), or one pretrained model retrofitted into every arm (`--retrofit`; its Transformer arm is the
model itself, so it is not parameter-matched: T²MLR adds its fusion parameters).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from t2mlr.analysis.finetune_plots import plot_pass_at_1
from t2mlr.baselines.matching import (
    ModelSpec,
    count_parameters,
    matched_arms,
    parse_model_specs,
)
from t2mlr.experiments.concurrent_runs import RunJob, resolve_workers, train_runs
from t2mlr.experiments.finetune_data import build_task_tokenizer, encode_sft
from t2mlr.experiments.finetune_presets import FinetunePreset
from t2mlr.experiments.finetune_tasks import (
    get_task,
    load_task_data,
    score_output,
    task_label,
)
from t2mlr.generation.text import GenerationSettings, generate_kwargs
from t2mlr.model import is_t2mlr
from t2mlr.model.pretrained import load_pretrained_tokenizer
from t2mlr.model.shapes import base_config_for_shape
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.sft import prompt_ids
from t2mlr.training.config import TrainConfig, config_from_tree
from t2mlr.training.model_factory import build_model
from t2mlr.training.runs import (
    accumulated_train_seconds,
    arm_model_section,
    claim_run_dirs,
    load_trained,
)
from t2mlr.utils import load_tokenizer, resolve_device

__all__ = ["ArmResult", "FinetunePlan", "StartingPoint", "rescore_predictions", "run_finetune", "wilson_interval"]

RESULTS_MD, RESULTS_JSON, FIGURE, PREDICTIONS = "results.md", "results.json", "pass_at_1.png", "predictions.jsonl"
_WRAPPER_TYPES = {"t2mlr": "t2mlr", "looped": "t2mlr_looped", "pause": "t2mlr_pause"}


@dataclass(frozen=True)
class StartingPoint:
    """Where the arms start: "scratch", "from" (`checkpoints`: arm name -> directory) or "retrofit" (`model`)."""

    kind: str = "scratch"
    checkpoints: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def of(self, arm: str) -> str:
        if self.kind == "from":
            return self.checkpoints[arm]
        return f"retrofit of {self.model}" if self.kind == "retrofit" else "scratch"


@dataclass(frozen=True)
class FinetunePlan:
    """A preset plus the command line's choices: arms, data, start and evaluation prefill."""

    preset: FinetunePreset
    specs: tuple[ModelSpec, ...]
    start: StartingPoint = StartingPoint()
    data: str | None = None
    variant: str | None = None
    prefill_depth: int | None = None


@dataclass
class ArmResult:
    """One arm's numbers, as written to results.json."""

    arm: str
    label: str
    parameters: int
    start: str
    steps: int
    tokens: int
    train_seconds: float
    eval_seconds: float
    correct: int
    total: int
    pass_at_1: float
    interval: tuple[float, float]
    extra: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- statistics


def wilson_interval(correct: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion (sensible at 0% and 100%, unlike the normal one)."""
    if total <= 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


# ---------------------------------------------------------------------------------------------- arms


def parse_arms(text: str) -> tuple[ModelSpec, ...]:
    """Arms as `t2mlr params` and the benchmarks name them; duplicates are refused."""
    specs = tuple(parse_model_specs(text))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--arms names an arm twice: {text!r}")
    return specs


def _scratch_base(preset: FinetunePreset, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
           "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if preset.shape is not None:
        return base_config_for_shape(preset.shape, **ids)
    return LlamaConfig(
        hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_heads, head_dim=preset.head_dim,
        max_position_embeddings=max(512, preset.max_length + preset.max_new_tokens), tie_word_embeddings=True, **ids,
    )


def _t2mlr_settings(preset: FinetunePreset) -> dict[str, Any]:
    return {"d_forward": preset.d_forward, "d_backward": preset.d_backward, "train_recurrence": preset.train_recurrence,
            "eval_recurrence": "exact", "recurrence_mask_policy": "mask" if preset.prompt_recurrence_mask else "all"}


def _spec_settings(spec: ModelSpec, preset: FinetunePreset) -> dict[str, Any]:
    """The arm's own settings for a retrofit (the spec's numbers)."""
    if spec.kind == "t2mlr":
        return {"l_start": spec.start, "l_end": spec.end, **_t2mlr_settings(preset)}
    if spec.kind == "looped":
        return {"loop_blocks": spec.loop_blocks, "loops": spec.loops}
    if spec.kind == "pause":
        return {"pauses": spec.period - 1}
    return {}


def check_checkpoint_matches(spec: ModelSpec, config: PretrainedConfig, where: str) -> None:
    """Refuse a checkpoint built for another arm (its model type and, for T²MLR, its placement)."""
    model_type = getattr(config, "model_type", None)
    expected = _WRAPPER_TYPES.get(spec.kind)
    if expected is None and model_type in _WRAPPER_TYPES.values():
        raise ValueError(f"{where}: arm {spec.name} is a plain Transformer but the checkpoint is a {model_type} model")
    if expected is not None and model_type != expected:
        raise ValueError(f"{where}: arm {spec.name} needs a {expected} checkpoint, found model_type {model_type!r}")
    if spec.kind == "t2mlr" and (config.l_start, config.l_end) != (spec.start, spec.end):
        raise ValueError(f"{where}: arm {spec.name} needs T²MLR({spec.start},{spec.end}) but the checkpoint is "
                         f"T²MLR({config.l_start},{config.l_end})")
    if spec.kind == "looped" and (config.loops != spec.loops):
        raise ValueError(f"{where}: arm {spec.name} needs {spec.loops} loops, the checkpoint has {config.loops}")
    if spec.kind == "pause" and config.pauses != spec.period - 1:
        raise ValueError(f"{where}: arm {spec.name} needs {spec.period - 1} pauses, the checkpoint has {config.pauses}")


def _section_from_checkpoint(spec: ModelSpec, directory: str, preset: FinetunePreset) -> dict[str, Any]:
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ValueError(f"--from for arm {spec.name}: {path} holds no config.json (a saved model or trainer checkpoint)")
    config = AutoConfig.from_pretrained(str(path))
    check_checkpoint_matches(spec, config, f"--from {path}")
    section = arm_model_section(spec, config, _t2mlr_settings(preset))
    if spec.kind == "t2mlr":  # the checkpoint's own recurrence settings, the preset's training choices
        section.update({k: getattr(config, k) for k in ("d_forward", "d_backward") if hasattr(config, k)})
    return {**section, "init_from": str(path)}


def model_sections(plan: FinetunePlan, tokenizer: PreTrainedTokenizerBase) -> tuple[dict[str, dict[str, Any]], int | None]:
    """Each arm's trainer `model:` section, and T²MLR's parameter count when the arms are matched to it."""
    preset, start = plan.preset, plan.start
    if start.kind == "from":
        return {s.name: _section_from_checkpoint(s, start.checkpoints[s.name], preset) for s in plan.specs}, None
    if start.kind == "retrofit":
        return {s.name: {"arch": s.kind, "pretrained": start.model, **_spec_settings(s, preset)} for s in plan.specs}, None
    target, arms = matched_arms(_scratch_base(preset, tokenizer), list(plan.specs), **_t2mlr_settings(preset))
    return {arm.spec.name: arm_model_section(arm.spec, arm.config, _t2mlr_settings(preset)) for arm in arms}, target


def train_config(preset: FinetunePreset, model: dict[str, Any], data_dir: Path, device: str) -> TrainConfig:
    """One arm's trainer config; every arm gets the same data, order, optimiser, schedule, steps and seed."""
    tree = {
        "model": model,
        "data": {
            "source": "factory", "factory": "t2mlr.experiments.finetune_data:sft_dataset",
            "kwargs": {"path": str(data_dir / "train.jsonl"), "tokenizer": str(data_dir / "tokenizer"),
                       "prompt_recurrence_mask": preset.prompt_recurrence_mask},
            "tokenizer": str(data_dir / "tokenizer"), "seq_len": preset.max_length, "seed": preset.seed,
        },
        "optim": {"lr": preset.lr, "betas": list(preset.betas), "weight_decay": preset.weight_decay, "grad_clip": 1.0},
        "schedule": {"kind": "cosine", "warmup_steps": preset.warmup_steps, "min_lr_ratio": preset.min_lr_ratio},
        "train": {"max_steps": preset.steps, "global_batch_size": preset.batch_size,
                  "micro_batch_size": preset.micro_batch_size or preset.batch_size, "seed": preset.seed,
                  "device": device},
        "checkpoint": {"every": 0, "keep_last": 1, "save_final": True},
        "logging": {"every": 10, "progress_bar": True},
    }
    return config_from_tree(tree)


# ---------------------------------------------------------------------------------------------- data


def _task_tokenizer(plan: FinetunePlan, train: list[dict[str, Any]]) -> PreTrainedTokenizerBase:
    start = plan.start
    if start.kind == "scratch":
        spec = get_task(plan.preset.task)
        # ProsQA with a fixed name pool: every concept is a training word, so whole words cover the evaluation
        syllables = spec.syllables and not plan.preset.task_settings.get("name_pool")
        return build_task_tokenizer((r["prompt"] + r["target"] for r in train), spec.phrases, syllables)
    if start.kind == "retrofit":  # any pretrained source: hub id, directory, GGUF file or a shortcut name
        tokenizer = load_pretrained_tokenizer(str(start.model))
    else:
        tokenizer = load_tokenizer(start.checkpoints[plan.specs[0].name])
    if tokenizer.pad_token_id is None:  # left padding for batched generation needs a pad id; EOS is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _fits(tokenizer: PreTrainedTokenizerBase, record: dict[str, Any], limit: int) -> bool:
    return encode_sft(tokenizer, record["prompt"], record["target"])["input_ids"].numel() <= limit


def prepare_data(plan: FinetunePlan, data_dir: Path) -> tuple[PreTrainedTokenizerBase, list[dict], dict[str, Any]]:
    """Data and tokenizer under `data_dir`; returns the tokenizer, the evaluation records and data facts."""
    preset = plan.preset
    train, evaluation, dropped = load_task_data(preset.task, preset.task_settings, preset.train_size,
                                                preset.eval_size, preset.seed, plan.data, plan.variant)
    tokenizer = _task_tokenizer(plan, train)
    kept = [r for r in tqdm(train, desc="check lengths", unit="row", dynamic_ncols=True, leave=False)
            if _fits(tokenizer, r, preset.max_length)]
    if not kept:
        raise ValueError(f"every training row is longer than max_length {preset.max_length} tokens")
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(data_dir / "tokenizer"))
    write_jsonl(kept, data_dir / "train.jsonl")
    write_jsonl(evaluation, data_dir / "eval.jsonl")
    facts = {"train_records": len(kept), "train_too_long": len(train) - len(kept), "eval_records": len(evaluation),
             "eval_dropped_seen_in_training": dropped, "vocab_size": len(tokenizer)}
    meta = {"task": preset.task, "task_settings": preset.task_settings, "seed": preset.seed, "data": plan.data,
            "variant": plan.variant, **facts}
    (data_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return tokenizer, evaluation, facts


# ---------------------------------------------------------------------------------------------- evaluation


def _left_padded(tokenizer: PreTrainedTokenizerBase, prompts: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    rows = [prompt_ids(tokenizer, p) for p in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def generate_batched(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                     settings: GenerationSettings, batch_size: int, device: torch.device, desc: str = "eval") -> list[str]:
    """Greedy continuations of `prompts`, `batch_size` at a time, left-padded (special tokens dropped)."""
    kwargs = generate_kwargs(model, settings)
    texts: list[str] = []
    model.eval()
    for lo in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch", dynamic_ncols=True, leave=False):
        inputs = _left_padded(tokenizer, prompts[lo : lo + batch_size], device)
        if is_t2mlr(model) and model.config.recurrence_mask_policy == "mask":
            inputs["recurrence_mask"] = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)  # prompts do not fuse R
        with torch.no_grad():
            out = model.generate(**inputs, **kwargs, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        width = inputs["input_ids"].shape[1]
        texts.extend(tokenizer.decode(row[width:], skip_special_tokens=True) for row in out)
    return texts


def prediction_rows(task: str, arm: str, records: list[dict[str, Any]], texts: list[str]) -> list[dict[str, Any]]:
    """The predictions file's lines for one arm (with the fields the task's scorer reads)."""
    fields = get_task(task).checker_fields
    rows = []
    for i, (record, text) in enumerate(zip(records, texts)):
        scored = score_output(task, record, text)
        rows.append({"arm": arm, "index": i, "prompt": record["prompt"], "gold": record["answer"], "generated": text,
                     "extracted": scored.extracted, "correct": scored.correct, **scored.extra,
                     **({"sample": {k: record[k] for k in fields}} if fields else {})})
    return rows


def rescore_predictions(task: str, path: str | Path) -> dict[str, float]:
    """pass@1 per arm recomputed from a predictions file's generated texts (not its `correct` column)."""
    totals: dict[str, list[int]] = {}
    for row in read_jsonl(path):
        record = {**row.get("sample", {}), "answer": row["gold"]}
        counts = totals.setdefault(row["arm"], [0, 0])
        counts[0] += int(score_output(task, record, row["generated"]).correct)
        counts[1] += 1
    return {arm: c / n for arm, (c, n) in totals.items()}


def _tokens_seen(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    seen = 0
    if path.is_file():
        for row in read_jsonl(path):
            seen = max(seen, int(row.get("tokens_seen", 0)))
    return seen


# ---------------------------------------------------------------------------------------------- reporting


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def results_table(results: list[ArmResult]) -> list[str]:
    extras = sorted({k for r in results for k in r.extra})
    head = "| arm | parameters | start | steps | tokens | training time | pass@1 | 95% interval |"
    rule = "|---|---:|---|---:|---:|---:|---:|---|"
    head += "".join(f" {k} |" for k in extras)
    rule += "---:|" * len(extras)
    lines = [head, rule]
    for r in results:
        lo, hi = r.interval
        row = (f"| {r.label} | {r.parameters:,} | {r.start} | {r.steps:,} | {r.tokens:,} | {_minutes(r.train_seconds)} | "
               f"{_pct(r.pass_at_1)} ({r.correct}/{r.total}) | {_pct(lo)}–{_pct(hi)} |")
        lines.append(row + "".join(f" {_pct(r.extra.get(k, float('nan')))} |" for k in extras))
    return lines


def _settings_line(plan: FinetunePlan, workers: int) -> str:
    p = plan.preset
    mask = ("on (T²MLR fuses R into target tokens only)" if p.prompt_recurrence_mask else "off (every token fuses R)")
    prefill = p.prefill + (f" (depth {plan.prefill_depth or p.d_forward})" if p.prefill == "jacobi" else "")
    path = f"jacobi path ({p.d_forward}, {p.d_backward})" if p.train_recurrence == "jacobi" else "exact path"
    return (f"AdamW (lr {p.lr:g}, betas {tuple(p.betas)}, weight decay {p.weight_decay:g}), {p.warmup_steps} warmup "
            f"steps then cosine to {p.min_lr_ratio:g}× lr, batch {p.batch_size}, {p.steps:,} steps, seed {p.seed}; "
            f"T²MLR trained on the {path}; prompt recurrence mask {mask}; evaluation: greedy, "
            f"{p.max_new_tokens} new tokens at most, batches of {p.eval_batch_size} left-padded prompts, T²MLR "
            f"prefill {prefill}; {'arms trained ' + str(workers) + ' at a time' if workers > 1 else 'arms trained in turn'}.")


def write_results(out: Path, plan: FinetunePlan, results: list[ArmResult], facts: dict[str, Any],
                  wall: float, device: str, workers: int, target: int | None) -> None:
    preset = plan.preset
    label = task_label(preset.task, plan.variant)
    matched = (f"non-T²MLR arms parameter-matched to T²MLR's {target:,} parameters" if target is not None
               else "arms as their checkpoints are (not re-matched)")
    lines = [
        f"# Reasoning finetune: {label}",
        "",
        f"Preset `{preset.name}`, device {device}, whole experiment: {_minutes(wall)}.",
        "",
        f"- Data: {facts['train_records']:,} training records ({facts['train_too_long']} longer than "
        f"{preset.max_length} tokens left out), {facts['eval_records']} held-out evaluation problems "
        f"({facts['eval_dropped_seen_in_training']} dropped as seen in training); task settings "
        f"{json.dumps(preset.task_settings)}" + (f"; data {plan.data}" if plan.data else "") + ".",
        f"- Models: {matched}; SFT with the prompt masked from the loss.",
        f"- Training and evaluation: {_settings_line(plan, workers)}",
        "- pass@1: one greedy sample per problem scored by the task's extractor; the interval is the 95% Wilson "
        "score interval over the problems.",
        *([f"- Preset notes: {preset.notes}"] if preset.notes else []),
        "",
        *results_table(results),
        "",
        f"![pass@1]({FIGURE})",
        "",
        f"Predictions (prompt, gold, generated text, extracted answer, correct): `{PREDICTIONS}`.",
        "",
    ]
    (out / RESULTS_MD).write_text("\n".join(lines), encoding="utf-8")
    payload = {"task": preset.task, "variant": plan.variant, "label": label, "preset": asdict(preset),
               "arms": [s.name for s in plan.specs], "start": asdict(plan.start), "data": plan.data,
               "prefill_depth": plan.prefill_depth, "data_facts": facts, "wall_seconds": wall, "device": device,
               "training_workers": workers, "matched_parameters": target,
               "results": [asdict(r) for r in results]}
    (out / RESULTS_JSON).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    bars = {label: {r.label: [(r.pass_at_1, *r.interval)] for r in results}}
    plot_pass_at_1(bars, out / FIGURE, title=f"{label} ({preset.name} preset, seed {preset.seed})")


# ---------------------------------------------------------------------------------------------- driver


def arm_label(spec: ModelSpec, start: StartingPoint) -> str:
    """The arm's name in tables and figures; a retrofit's Transformer arm is the pretrained model itself, which
    T²MLR's fusion parameters outnumber, so it is not called matched."""
    if start.kind == "retrofit" and spec.kind == "transformer":
        return "Transformer (the pretrained model)"
    return spec.label


def _check_before_training(configs: dict[str, TrainConfig]) -> None:
    """Build every arm (loading its starting weights) so a bad checkpoint fails before any training."""
    for name, cfg in configs.items():
        if cfg.model.init_from is None:
            continue
        try:
            build_model(cfg.model)
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            raise ValueError(f"arm {name}: its starting checkpoint does not fit the arm: {err}") from err


def evaluate_arm(plan: FinetunePlan, cfg: TrainConfig, checkpoint: Path, tokenizer: PreTrainedTokenizerBase,
                 records: list[dict[str, Any]], arm: str) -> tuple[torch.nn.Module, list[str], float]:
    model, device = load_trained(cfg, checkpoint)
    preset = plan.preset
    settings = GenerationSettings(max_new_tokens=preset.max_new_tokens, prefill=preset.prefill if is_t2mlr(model) else "exact",
                                  prefill_depth=plan.prefill_depth if preset.prefill == "jacobi" and is_t2mlr(model) else None)
    started = time.perf_counter()
    texts = generate_batched(model, tokenizer, [r["prompt"] for r in records], settings, preset.eval_batch_size,
                             device, desc=f"eval {arm}")
    return model, texts, time.perf_counter() - started


def run_finetune(plan: FinetunePlan, out: str | Path, device: str = "auto", resume: bool = False,
                 overwrite: bool = False, workers: int | None = None) -> list[ArmResult]:
    """Data → one training per arm → batched greedy evaluation → results (see the module docstring)."""
    started = time.perf_counter()
    out = Path(out)
    preset = plan.preset
    names = [s.dir_name for s in plan.specs]
    claim_run_dirs(out, names, resume=resume, overwrite=overwrite)
    tqdm.write(f"[finetune] {preset.task}, preset {preset.name}: data → {out / 'data'}")
    tokenizer, records, facts = prepare_data(plan, out / "data")
    sections, target = model_sections(plan, tokenizer)
    configs = {s.name: train_config(preset, sections[s.name], out / "data", device) for s in plan.specs}
    _check_before_training(configs)
    workers = resolve_workers(workers, len(plan.specs), resolve_device(device))
    tqdm.write(f"[finetune] training {', '.join(s.label for s in plan.specs)} ({preset.steps:,} steps each) → {out}"
               + (f", {workers} at a time" if workers > 1 else ""))
    jobs = [RunJob(s.name, configs[s.name], out / s.dir_name) for s in plan.specs]
    trained = train_runs(jobs, resume, workers)
    results, rows, device_name = [], [], device
    for spec, dirname in zip(plan.specs, names):
        cfg = configs[spec.name]
        model, texts, eval_seconds = evaluate_arm(plan, cfg, trained[spec.name].checkpoint, tokenizer, records, spec.name)
        device_name = str(next(model.parameters()).device)
        arm_rows = prediction_rows(preset.task, spec.name, records, texts)
        rows.extend(arm_rows)
        correct = sum(r["correct"] for r in arm_rows)
        extra_keys = [k for k in arm_rows[0] if k in ("f1", "answer_correct")]
        results.append(ArmResult(
            arm=spec.name, label=arm_label(spec, plan.start), parameters=count_parameters(model),
            start=plan.start.of(spec.name),
            steps=preset.steps, tokens=_tokens_seen(out / dirname),
            train_seconds=accumulated_train_seconds(out / dirname, trained[spec.name].seconds), eval_seconds=eval_seconds,
            correct=correct, total=len(arm_rows), pass_at_1=correct / len(arm_rows),
            interval=wilson_interval(correct, len(arm_rows)),
            extra={k: sum(r[k] for r in arm_rows) / len(arm_rows) for k in extra_keys},
        ))
        del model
    write_jsonl(rows, out / PREDICTIONS)
    wall = time.perf_counter() - started
    write_results(out, plan, results, facts, wall, device_name, workers, target)
    tqdm.write(f"[finetune] wrote {out / RESULTS_MD}, {out / RESULTS_JSON}, {out / FIGURE}, {out / PREDICTIONS} "
               f"({_minutes(wall)})")
    return results


def with_overrides(preset: FinetunePreset, **changes: Any) -> FinetunePreset:
    """The preset with the command line's overrides (None: keep the preset's value)."""
    return replace(preset, **{k: v for k, v in changes.items() if v is not None})
