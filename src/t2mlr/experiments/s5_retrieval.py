"""The S5-Retrieval experiment (paper §5): T²MLR vs a parameter-matched Transformer and LSTM.

`run_experiment(preset, out)` does everything `t2mlr experiment s5-retrieval` promises:

1. data: the tokenizer, the held-out evaluation set (`eval.jsonl`, every N of the preset's evaluation
   range) and a peek at the training stream (`train_sample.jsonl`); training rows are generated on
   demand, deterministically per index (`t2mlr.experiments.s5_data`);
2. training of the three models with the project trainer (`t2mlr.training`), one run directory each:
   T²MLR on the preset's training path (exact or Jacobi), the matched Transformer and the matched LSTM
   (`t2mlr.baselines`), all with AdamW + warmup + cosine and the same batch size; on a CPU the runs
   train side by side in worker processes (`t2mlr.experiments.concurrent_runs`), on a GPU in turn;
3. teacher-forced evaluation per N, T²MLR on its **exact** path (`t2mlr.experiments.s5_eval`);
4. `results.md`, `results.json` and `accuracy_vs_length.png`.

Label alignment (transduction vs the models' internal causal shift) is explained in
`t2mlr.experiments.s5_data`: labels are shifted right by one and each row ends with one extra `<eos>`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from t2mlr.analysis.s5_plots import plot_accuracy_vs_length
from t2mlr.baselines.looped import parse_loop_blocks
from t2mlr.baselines.matching import (
    COMPUTE_MATCHED,
    MODEL_SPEC_FORMS,
    MatchedSet,
    ModelSpec,
    count_parameters,
    matched_arms,
    matched_models,
    parse_model_spec,
)
from t2mlr.experiments.concurrent_runs import (
    RunJob,
    TrainedRun,
    fixed_threads,
    resolve_workers,
    train_runs,
)
from t2mlr.experiments.s5_data import S5DataSpec
from t2mlr.experiments.s5_eval import NMetrics, evaluate_by_n, forward_kwargs, summarize
from t2mlr.experiments.s5_presets import MODEL_NAMES, S5Preset, t2mlr_config
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.tokenizers import build_s5_tokenizer
from t2mlr.training.config import TrainConfig, config_from_tree
from t2mlr.training.runs import (
    accumulated_train_seconds,
    arm_model_section,
    base_section,
    claim_run_dirs,
    load_trained,
)
from t2mlr.utils import resolve_device

__all__ = ["ExperimentPlan", "ModelResult", "finish_experiment", "plan_experiment", "run_experiment"]

LABELS = {"t2mlr": "T²MLR", "transformer": "Transformer (matched)", "lstm": "LSTM (matched)"}
RESULTS_MD, RESULTS_JSON, FIGURE = "results.md", "results.json", "accuracy_vs_length.png"
TRAIN_PEEK = 200  # training rows written out for inspection


@dataclass
class ModelResult:
    """One trained model's numbers, as written to results.json."""

    name: str
    label: str
    parameters: int
    steps: int
    train_seconds: float
    eval_seconds: float
    per_n: dict[int, NMetrics] = field(default_factory=dict)
    train_path: str = ""  # "Jacobi (16, 4)", "exact", "plain" (no recurrence)
    eval_path: str = ""  # "exact" for T²MLR, "plain" for the baselines


# ---------------------------------------------------------------------------------------------- data


def data_spec(preset: S5Preset) -> S5DataSpec:
    return S5DataSpec(preset.k, preset.dict_size, preset.alphabet, preset.num_actions, preset.seed)


def prepare_data(preset: S5Preset, data_dir: Path) -> tuple[PreTrainedTokenizerBase, list[dict[str, Any]]]:
    """Tokenizer, evaluation set and a training peek under `data_dir`; returns the tokenizer and eval samples."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_s5_tokenizer(preset.k, preset.alphabet)
    tokenizer.save_pretrained(str(data_dir / "tokenizer"))
    spec = data_spec(preset)
    eval_path = data_dir / "eval.jsonl"
    if eval_path.is_file():  # written by an earlier run of the same preset (checked by the caller)
        samples = read_jsonl(eval_path)
    else:
        samples = _generate_eval(spec, preset)
        write_jsonl(samples, eval_path)
    peek = (spec.sample(preset.train_n, "train", i) for i in range(min(TRAIN_PEEK, preset.train_size)))
    write_jsonl(peek, data_dir / "train_sample.jsonl")
    actions = spec.action_set()
    meta = {"data": data_settings(preset), "preset": asdict(preset),
            "action_set": None if actions is None else [list(a) for a in actions]}
    (data_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return tokenizer, samples


def _generate_eval(spec: S5DataSpec, preset: S5Preset) -> list[dict[str, Any]]:
    lo, hi = preset.eval_n
    samples = []
    for n in tqdm(range(lo, hi + 1), desc="eval data", unit="N", dynamic_ncols=True):
        samples.extend(spec.sample((n, n), f"eval-n{n}", j) for j in range(preset.eval_size_per_n))
    return samples


# ---------------------------------------------------------------------------------------------- models


def arm_spec(name: str) -> ModelSpec | None:
    """The comparison arm a model name beyond the default three spells (None for t2mlr, transformer, lstm).

    The default three keep the preset's own settings; any other arm of `t2mlr params`'s grammar joins them:
    another T²MLR placement ("t2mlr:2-3") or a looped / pause-token baseline ("looped:full:2", "pause:2"),
    the baselines at the width matched to the preset's T²MLR.
    """
    if name in MODEL_NAMES:
        return None
    try:
        return parse_model_spec(name)
    except ValueError as err:
        raise ValueError(f"unknown model {name!r} ({err}): use t2mlr, transformer, lstm or one of "
                         f"{MODEL_SPEC_FORMS}") from err


def check_models(models: tuple[str, ...], preset: S5Preset) -> None:
    """Every model name known, none twice, every block range inside the preset's blocks, and every step
    count known (checked before any data is written)."""
    num_layers = preset.num_layers
    if not models:
        raise ValueError(f"name at least one model: t2mlr, transformer, lstm or one of {MODEL_SPEC_FORMS}")
    for name in models:
        steps_of(preset, name)
        spec = arm_spec(name)
        if spec is None or spec.kind in ("pause", "transformer"):
            continue
        start, end = (spec.start, spec.end) if spec.kind == "t2mlr" else parse_loop_blocks(spec.loop_blocks, num_layers)
        if not 1 <= start <= end <= num_layers:
            raise ValueError(f"model {name!r}: blocks {start}-{end} are outside the preset's 1-{num_layers}")
    if len(set(models)) != len(models):
        raise ValueError(f"a model is named twice in {models}")


def label_of(name: str) -> str:
    spec = arm_spec(name)
    return LABELS[name] if spec is None else spec.label


def run_dir_name(name: str) -> str:
    """The model's run directory under --out ("looped:full:2" → "looped_full_2")."""
    spec = arm_spec(name)
    return name if spec is None else spec.dir_name


def steps_of(preset: S5Preset, name: str) -> int:
    """Training steps: the preset's own for the default three; T²MLR's for other placements and training
    paths, the matched Transformer's for the looped and pause baselines (the paper gives all baselines the
    same budget), and T²MLR's steps times the preset's measured step-time ratio for `transformer:compute-matched`."""
    spec = arm_spec(name)
    if spec is None:
        return preset.steps[name]
    if spec.budget == COMPUTE_MATCHED:
        return preset.compute_matched_steps()
    return preset.steps["t2mlr" if spec.kind == "t2mlr" else "transformer"]


def model_sections(
    preset: S5Preset, tokenizer: PreTrainedTokenizerBase, models: tuple[str, ...] = MODEL_NAMES
) -> tuple[dict[str, dict[str, Any]], MatchedSet]:
    """The trainer's `model:` section for each model, and the parameter matching behind them.

    The baselines are plain causal LMs, built by type name (`arch: transformer` in the trainer's config
    means "no recurrence keywords"; the LSTM is one as well).
    """
    config = t2mlr_config(preset, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    matched = matched_models(config, lstm_layers=preset.lstm_layers)
    t2mlr_settings = {"d_forward": preset.d_forward, "d_backward": preset.d_backward,
                      "train_recurrence": preset.train_recurrence, "eval_recurrence": "exact"}
    sections = {
        "t2mlr": {"arch": "t2mlr", "base": base_section(config.base_config), "l_start": preset.l_start,
                  "l_end": preset.l_end, **t2mlr_settings},
        "transformer": {"arch": "transformer", "base": base_section(matched.transformer)},
        "lstm": {"arch": "transformer", "base": base_section(matched.lstm)},
    }
    extra = [name for name in models if arm_spec(name) is not None]
    if extra:
        _, arms = matched_arms(config.base_config, [arm_spec(name) for name in extra], **t2mlr_settings)
        sections.update({name: arm_model_section(arm.spec, arm.config, {**t2mlr_settings, **arm.spec.path_settings()})
                         for name, arm in zip(extra, arms)})
    return sections, matched


def train_config(preset: S5Preset, name: str, model: dict[str, Any], tokenizer_dir: Path, device: str,
                 keep_last: int | None = 1) -> TrainConfig:
    """A full trainer config for one model of the experiment (written to its run directory); `keep_last`
    checkpoints are kept (None: all, for analyses of mid-training checkpoints)."""
    lo, hi = preset.train_n
    data_kwargs = {
        "tokenizer": str(tokenizer_dir), "k": preset.k, "dict_size": preset.dict_size, "alphabet": preset.alphabet,
        "n_lo": lo, "n_hi": hi, "size": preset.train_size, "num_actions": preset.num_actions, "seed": preset.seed,
    }
    tree = {
        "model": model,
        "data": {
            "source": "factory", "factory": "t2mlr.experiments.s5_data:s5_stream_dataset", "kwargs": data_kwargs,
            "seq_len": preset.max_length(), "labels_aligned_to_inputs": True, "pad_token_id": 0, "seed": preset.seed,
        },
        "optim": {"lr": preset.lr, "betas": list(preset.betas), "weight_decay": preset.weight_decay, "grad_clip": 1.0},
        "schedule": {"kind": "cosine", "warmup_steps": preset.warmup_steps, "min_lr_ratio": preset.min_lr_ratio},
        "train": {
            "max_steps": steps_of(preset, name), "global_batch_size": preset.batch_size,
            "micro_batch_size": preset.micro_batch_size or preset.batch_size, "seed": preset.seed, "device": device,
        },
        "checkpoint": {"every": preset.checkpoint_every, "keep_last": keep_last, "save_final": True},
        "logging": {"every": 10, "progress_bar": True},
    }
    return config_from_tree(tree)


# ---------------------------------------------------------------------------------------------- reporting


def _fmt(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _span(lo: int, hi: int) -> str:
    return f"N {lo}" if lo == hi else f"N {lo}–{hi}"


def results_table(results: list[ModelResult], preset: S5Preset) -> list[str]:
    lo, hi = preset.train_n
    beyond = (hi + 1, preset.eval_n[1])
    has_beyond = beyond[0] <= beyond[1]
    head = (f"| model | trained on | evaluated on | parameters | steps | training time | EM ({_span(lo, hi)}) | "
            f"token acc ({_span(lo, hi)}) |")
    rule = "|---|---|---|---:|---:|---:|---:|---:|"
    if has_beyond:
        head += f" EM ({_span(*beyond)}) | token acc ({_span(*beyond)}) |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in results:
        inside = summarize(r.per_n, lo, hi) or (float("nan"), float("nan"))
        row = (f"| {r.label} | {r.train_path} | {r.eval_path} | {r.parameters:,} | {r.steps:,} | "
               f"{_minutes(r.train_seconds)} | {_fmt(inside[0])} | {_fmt(inside[1])} |")
        if has_beyond:
            outside = summarize(r.per_n, *beyond) or (float("nan"), float("nan"))
            row += f" {_fmt(outside[0])} | {_fmt(outside[1])} |"
        lines.append(row)
    return lines


def per_n_table(results: list[ModelResult]) -> list[str]:
    ns = sorted({n for r in results for n in r.per_n})
    lines = ["| N | " + " | ".join(f"{r.label} EM / tok" for r in results) + " |",
             "|---:|" + "---:|" * len(results)]
    for n in ns:
        cells = [f"{_fmt(r.per_n[n].exact_match)} / {_fmt(r.per_n[n].token_accuracy)}" if n in r.per_n else "–"
                 for r in results]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def describe_data(preset: S5Preset, models: tuple[str, ...] = MODEL_NAMES) -> str:
    actions = ("all 120 permutations of S5" if preset.num_actions is None else
               f"a fixed {preset.num_actions}-element generating set of S5 (see `t2mlr.tasks.s5.generating_set`)")
    return (f"K = {preset.k}, dictionary of {preset.dict_size} of the 120 keys (resampled per sequence), "
            f"{len(preset.alphabet)}-symbol value alphabet, actions from {actions}; training N uniform in "
            f"{preset.train_n[0]}–{preset.train_n[1]} ({_freshness(preset, models)}), evaluation N "
            f"{preset.eval_n[0]}–{preset.eval_n[1]} with {preset.eval_size_per_n} held-out sequences per N.")


def _freshness(preset: S5Preset, models: tuple[str, ...]) -> str:
    drawn = max(steps_of(preset, name) for name in models) * preset.batch_size
    if preset.train_size >= drawn:
        return "a fresh sequence for every training example"
    return f"{preset.train_size:,} training sequences, revisited"


def describe_models(preset: S5Preset, matched: MatchedSet) -> str:
    path = (f"Jacobi (d_forward = {preset.d_forward}, d_backward = {preset.d_backward})"
            if preset.train_recurrence == "jacobi" else "the exact path")
    return (f"Llama backbone, {preset.num_layers} blocks, hidden {preset.hidden_size}, {preset.num_heads} heads of "
            f"{preset.head_dim}, MLP {preset.intermediate_size}, RoPE. T²MLR({preset.l_start},{preset.l_end}) "
            f"trained on {path} (an arm spelt with its own path, e.g. t2mlr:S-E:jacobi:F:B, on that path: see the "
            f"table), evaluated on the exact path. Transformer: the same backbone widened to hidden "
            f"{matched.transformer.hidden_size}. LSTM: {preset.lstm_layers} layers, hidden {matched.lstm.hidden_size}. "
            f"AdamW (lr {preset.lr:g}, betas {preset.betas}, weight decay {preset.weight_decay:g}), "
            f"{preset.warmup_steps} warmup steps then cosine to {preset.min_lr_ratio:g}× lr, batch {preset.batch_size}.")


def _concurrency(workers: int) -> str:
    if workers <= 1:
        return "the models trained one after another"
    return f"the models trained {workers} at a time in worker processes, so their training times overlap"


def _compute_matched_lines(preset: S5Preset, models: tuple[str, ...]) -> list[str]:
    if not any((spec := arm_spec(name)) is not None and spec.budget == COMPUTE_MATCHED for name in models):
        return []
    line = (f"- Compute-matched Transformer: {preset.compute_matched_steps():,} steps = "
            f"{preset.compute_matched_ratio:g} × T²MLR's {preset.steps['t2mlr']:,}. {preset.compute_matched_basis}")
    return [line]


def _failure_lines(failures: Mapping[str, str]) -> list[str]:
    if not failures:
        return []
    return ["", "## Runs that stopped", "",
            *[f"- {label_of(name)} (`{name}`): {message}" for name, message in failures.items()]]


def write_results_md(path: Path, preset: S5Preset, matched: MatchedSet, results: list[ModelResult],
                     wall_seconds: float, device: str, workers: int = 1, models: tuple[str, ...] = MODEL_NAMES,
                     failures: Mapping[str, str] | None = None) -> None:
    lines = [
        "# S5-Retrieval: T²MLR vs parameter-matched baselines",
        "",
        (f"Preset `{preset.name}`, seed {preset.seed}, device {device}, whole experiment (data, training, "
         f"evaluation, plot): {_minutes(wall_seconds)}; {_concurrency(workers)}. Every run and the evaluation "
         f"computed on {preset.torch_threads} torch thread(s) (fixed by the preset, so the numbers do not depend "
         "on the schedule or on the machine's load; the times do)."),
        "",
        f"- Data: {describe_data(preset, models)}",
        f"- Models: {describe_models(preset, matched)}",
        *_compute_matched_lines(preset, models),
        ("- Metrics: teacher-forced transduction, argmax at each position against the target there, scored after "
         "the delimiter only; EM = whole scored part right; columns average the per-N numbers (each N weighted "
         "equally)."),
        *([f"- Preset notes: {preset.notes}"] if preset.notes else []),
        "",
        *results_table(results, preset),
        "",
        f"![accuracy vs length]({FIGURE})",
        "",
        "## Per N (exact match / per-token accuracy)",
        "",
        *per_n_table(results),
        *_failure_lines(failures or {}),
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


def write_results_json(path: Path, preset: S5Preset, results: list[ModelResult], wall_seconds: float,
                       workers: int = 1, failures: Mapping[str, str] | None = None) -> None:
    payload = {
        "preset": asdict(preset),
        "wall_seconds": wall_seconds,
        "training_workers": workers,
        "torch_threads": preset.torch_threads,
        "models": [{**asdict(r), "per_n": {str(n): asdict(m) for n, m in r.per_n.items()}} for r in results],
        "failed": dict(failures or {}),
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- driver


def _prepare_out(out: Path, models: tuple[str, ...], overwrite: bool, resume: bool) -> None:
    """Refuse to mix runs (`claim_run_dirs`); overwriting a model's run also regenerates the data."""
    if claim_run_dirs(out, [run_dir_name(name) for name in models], resume=resume, overwrite=overwrite) and overwrite:
        shutil.rmtree(out / "data", ignore_errors=True)


def data_settings(preset: S5Preset) -> dict[str, Any]:
    """The preset fields the written data depend on (JSON-normalised, for comparison with meta.json)."""
    names = ("k", "dict_size", "alphabet", "train_n", "eval_n", "eval_size_per_n", "num_actions", "seed")
    return json.loads(json.dumps({name: getattr(preset, name) for name in names}))


def _check_same_data(data_dir: Path, preset: S5Preset) -> None:
    meta = data_dir / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("data") != data_settings(preset):
        raise ValueError(f"{data_dir} was generated for different data settings; use another --out or --overwrite")


@dataclass
class ExperimentPlan:
    """One experiment ready to train: its data written, every model's trainer config built."""

    preset: S5Preset
    out: Path
    models: tuple[str, ...]
    tokenizer: PreTrainedTokenizerBase
    eval_samples: list[dict[str, Any]]
    matched: MatchedSet
    configs: dict[str, TrainConfig]

    def jobs(self, prefix: str = "") -> list[RunJob]:
        """One training job per model, on the preset's fixed torch threads (`prefix` keeps the names of
        several experiments' jobs apart)."""
        return [RunJob(prefix + name, self.configs[name], self.out / run_dir_name(name), self.preset.torch_threads)
                for name in self.models]


def plan_experiment(
    preset: S5Preset, out: str | Path, device: str = "auto", models: tuple[str, ...] = MODEL_NAMES,
    resume: bool = False, overwrite: bool = False, keep_all_checkpoints: tuple[str, ...] = (),
) -> ExperimentPlan:
    """Check the models, claim the run directories, write the data and build every trainer config.
    `keep_all_checkpoints`: models whose every periodic checkpoint is kept (for mid-training analyses)."""
    check_models(models, preset)
    out = Path(out)
    _prepare_out(out, models, overwrite, resume)
    _check_same_data(out / "data", preset)
    tqdm.write(f"[s5] preset {preset.name} (seed {preset.seed}): data → {out / 'data'}")
    tokenizer, eval_samples = prepare_data(preset, out / "data")
    sections, matched = model_sections(preset, tokenizer, models)
    configs = {name: train_config(preset, name, sections[name], out / "data" / "tokenizer", device,
                                  keep_last=None if name in keep_all_checkpoints else 1) for name in models}
    return ExperimentPlan(preset, out, models, tokenizer, eval_samples, matched, configs)


def evaluate_trained(plan: ExperimentPlan, trained: Mapping[str, TrainedRun]) -> tuple[list[ModelResult], str]:
    """Per-N evaluation of every trained model (the others are left out), on the preset's torch threads;
    returns the results and the device they ran on."""
    results, device_name = [], "cpu"
    with fixed_threads(plan.preset.torch_threads):
        for name in plan.models:
            if name not in trained:
                continue
            config = plan.configs[name]
            model, used = load_trained(config, trained[name].checkpoint)
            device_name = str(used)
            eval_started = time.perf_counter()
            per_n = evaluate_by_n(model, plan.eval_samples, plan.tokenizer, plan.preset.eval_batch_size, used,
                                  desc=f"eval {name}")
            results.append(ModelResult(
                name=name, label=label_of(name), parameters=count_parameters(model),
                steps=steps_of(plan.preset, name),
                train_seconds=accumulated_train_seconds(plan.out / run_dir_name(name), trained[name].seconds),
                eval_seconds=time.perf_counter() - eval_started, per_n=per_n, train_path=describe_path(config),
                eval_path=eval_path_of(model),
            ))
            del model
    return results, device_name


def finish_experiment(plan: ExperimentPlan, trained: Mapping[str, TrainedRun], started: float, workers: int,
                      failures: Mapping[str, str] | None = None) -> list[ModelResult]:
    """Evaluate the trained models and write results.md, results.json and accuracy_vs_length.png."""
    out, preset = plan.out, plan.preset
    results, device_name = evaluate_trained(plan, trained)
    if results:
        curves = {r.label: {n: (m.exact_match, m.token_accuracy) for n, m in r.per_n.items()} for r in results}
        plot_accuracy_vs_length(curves, preset.train_n, out / FIGURE,
                                title=f"S5-Retrieval ({preset.name} preset, seed {preset.seed})")
    wall = time.perf_counter() - started
    write_results_md(out / RESULTS_MD, preset, plan.matched, results, wall, device_name, workers, plan.models, failures)
    write_results_json(out / RESULTS_JSON, preset, results, wall, workers, failures)
    tqdm.write(f"[s5] wrote {out / RESULTS_MD}, {out / RESULTS_JSON} and {out / FIGURE} ({_minutes(wall)})")
    return results


def run_experiment(
    preset: S5Preset,
    out: str | Path,
    device: str = "auto",
    models: tuple[str, ...] = MODEL_NAMES,
    resume: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
) -> list[ModelResult]:
    """Data → trainings → per-N evaluation → results.md / results.json / accuracy_vs_length.png.

    `workers`: trainings run side by side in that many processes (`t2mlr.experiments.concurrent_runs`);
    None picks one per model up to torch's CPU threads on CPU, and one on a GPU. Every run trains on the
    preset's `torch_threads`, so the schedule changes the times only, never the numbers.
    """
    started = time.perf_counter()
    plan = plan_experiment(preset, out, device, models, resume, overwrite)
    workers = resolve_workers(workers, len(models), resolve_device(device))
    tqdm.write(f"[s5] training {', '.join(f'{label_of(n)} ({steps_of(preset, n):,} steps)' for n in models)} → "
               f"{plan.out}" + (f", {workers} at a time in worker processes" if workers > 1 else ""))
    trained = train_runs(plan.jobs(), resume, workers)
    return finish_experiment(plan, trained, started, workers)


def describe_path(cfg: TrainConfig) -> str:
    """The path a model's training took, from its trainer config (the model reports the same in
    metrics.jsonl: `recurrence` and `jacobi_iterations` of every training record)."""
    m = cfg.model
    if m.arch != "t2mlr":
        return "plain"
    if m.train_recurrence == "jacobi":
        return f"Jacobi ({m.d_forward}, {m.d_backward})"
    if m.bptt_window is not None:
        return f"exact (BPTT window {m.bptt_window})"
    return m.train_recurrence


def eval_path_of(model: Any) -> str:
    """The path the evaluation runs the model on (`s5_eval.forward_kwargs`)."""
    return forward_kwargs(model).get("recurrence", "plain")
