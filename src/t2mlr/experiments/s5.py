"""S5-Retrieval (paper §5): T²MLR against a parameter-matched Transformer and LSTM.

These configs: `configs/experiments/s5_{paper,cpu,tiny}.yaml` (paper → cpu → tiny, and the evidence study's
`cpu_deep`, `tiny_deep`), each a trainer config for the T²MLR arm plus the task section `S5Task`. The
baselines are the same tree with the matched model (`t2mlr.training.arms.matched_arm`); any arm of
`t2mlr params`'s grammar joins them (`t2mlr:2-3`, `t2mlr:1-2:jacobi:16:4`, `looped:full:2`, `pause:2`,
`transformer:compute-matched`).

This data: the held-out evaluation set (OUT/data/eval.jsonl, every N of `task.eval_n`) and training rows
generated on demand, deterministically per index (`t2mlr.tasks.s5_data`; labels shifted for the
transduction alignment, explained there).

This score: teacher-forced exact match and per-token accuracy per N, scored after the delimiter, T²MLR on
its exact path (`evaluate_by_n`); OUT/results.md, OUT/results.json and OUT/accuracy_vs_length.png.

Every arm trains on `task.torch_threads` CPU threads (1): the count sets the float summation order of the
CPU kernels, so a seed's numbers do not depend on how many runs share the machine or on its load.
Imports of torch and the trainer happen inside the functions, so `t2mlr experiment --help` and config
errors need neither.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from t2mlr.analysis.common import fixed_depth
from t2mlr.analysis.figures import plot_accuracy_vs_length
from t2mlr.analysis.report import minutes, optimizer_settings, percent, table, write_result
from t2mlr.baselines.looped import parse_loop_blocks
from t2mlr.baselines.matching import COMPUTE_MATCHED, MODEL_SPEC_FORMS, ModelSpec, count_parameters, parse_model_spec
from t2mlr.baselines.recurrent import RECURRENT_CELLS
from t2mlr.experiments.sections import S5Task, preset_config
from t2mlr.model import is_t2mlr
from t2mlr.model.configuration import build_base_config
from t2mlr.settings import check_block_range
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.s5_data import S5DataSpec
from t2mlr.tasks.scoring import aggregate_s5_by_n, score_s5_prediction
from t2mlr.tasks.tokenizers import build_s5_tokenizer
from t2mlr.training.arms import (
    Arm,
    TrainedArm,
    arm_from_tree,
    base_section,
    claim_run_dirs,
    fixed_threads,
    load_trained,
    matched_arm,
    resolve_workers,
    t2mlr_of,
    train_arms,
)
from t2mlr.training.config import TrainConfig, config_from_tree, deep_merge, load_sections
from t2mlr.training.distributed import DistEnv, computed_by_main, current_env, shard_and_gather
from t2mlr.utils import cpu_arithmetic, off_main_rank

__all__ = ["MODEL_NAMES", "S5Plan", "S5Task", "dry_run_arms", "evaluate_by_n", "finish", "plan", "run"]

MODEL_NAMES = ("t2mlr", "transformer", "lstm")  # the default arms (the paper's three)
NAMED_MODELS = (*MODEL_NAMES, "gru", "rnn")  # the arms named by a word; the others are comparison specs
LABELS = {"t2mlr": "T²MLR", "transformer": "Transformer (matched)", "lstm": "LSTM (matched)", "gru": "GRU (matched)",
          "rnn": "RNN (matched)"}
RESULTS_MD, RESULTS_JSON, FIGURE = "results.md", "results.json", "accuracy_vs_length.png"
TRAIN_PEEK = 200  # training rows written out for inspection


@dataclass
class NMetrics:
    """Scores of one N: exact-match rate, per-token accuracy, number of sequences."""

    exact_match: float
    token_accuracy: float
    count: int


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


@dataclass
class S5Plan:
    """One experiment ready to train: its config, its data written, every arm built."""

    preset: str
    task: S5Task
    tree: dict[str, Any]  # the T²MLR arm's trainer config, filled in for this tokenizer and data
    out: Path
    models: tuple[str, ...]
    tokenizer: Any
    eval_samples: list[dict[str, Any]]
    arms: dict[str, Arm]

    @property
    def seed(self) -> int:
        return int(self.tree["train"]["seed"])

    def steps(self, name: str) -> int:
        return self.arms[name].config.train.max_steps


# ---------------------------------------------------------------------------------------------- arms


def arm_spec(name: str) -> ModelSpec | None:
    """The comparison arm a model name beyond the words of NAMED_MODELS spells (None for those)."""
    if name in NAMED_MODELS:
        return None
    try:
        return parse_model_spec(name)
    except ValueError as err:
        raise ValueError(f"unknown model {name!r} ({err}): use {', '.join(NAMED_MODELS)} or one of "
                         f"{MODEL_SPEC_FORMS}") from err


def is_t2mlr_arm(name: str) -> bool:
    spec = arm_spec(name)
    return name == "t2mlr" if spec is None else spec.kind == "t2mlr"


def label_of(name: str) -> str:
    spec = arm_spec(name)
    return LABELS[name] if spec is None else spec.label


def run_dir_name(name: str) -> str:
    """The model's run directory under OUT ("looped:full:2" → "looped_full_2")."""
    spec = arm_spec(name)
    return name if spec is None else spec.dir_name


def steps_of(task: S5Task, t2mlr_steps: int, name: str) -> int:
    """T²MLR's steps for T²MLR arms, the baselines' for the others (the paper gives all baselines one budget),
    and T²MLR's steps times the measured step-time ratio for `transformer:compute-matched`."""
    if is_t2mlr_arm(name):
        return t2mlr_steps
    if (spec := arm_spec(name)) is not None and spec.budget == COMPUTE_MATCHED:
        if task.compute_matched_ratio is None:
            raise ValueError("this preset has no measured training-compute ratio (task.compute_matched_ratio), so "
                             "it cannot train transformer:compute-matched")
        return max(1, round(task.compute_matched_ratio * t2mlr_steps))
    return t2mlr_steps if task.baseline_steps is None else task.baseline_steps


def check_models(models: Sequence[str], num_layers: int) -> None:
    """Every model name known, none twice, every block range inside the backbone (before any data is written)."""
    if not models:
        raise ValueError(f"name at least one model: {', '.join(NAMED_MODELS)} or one of {MODEL_SPEC_FORMS}")
    if len(set(models)) != len(models):
        raise ValueError(f"a model is named twice in {tuple(models)}")
    for name in models:
        spec = arm_spec(name)
        if spec is None or spec.kind in ("pause", "transformer"):
            continue
        blocks = (spec.start, spec.end) if spec.kind == "t2mlr" else parse_loop_blocks(spec.loop_blocks, num_layers)
        try:
            check_block_range(*blocks, num_layers, ("start", "end"))
        except ValueError as err:
            raise ValueError(f"model {name!r}: blocks {blocks[0]}-{blocks[1]} are outside the preset's "
                             f"1-{num_layers} ({err})") from err


def build_arms(task: S5Task, tree: dict[str, Any], models: Sequence[str], keep_all_checkpoints: Sequence[str] = ()
               ) -> dict[str, Arm]:
    """Every model's arm: T²MLR placements and paths are dotted overrides of the tree, the baselines its
    matched model; `keep_all_checkpoints`: arms whose every periodic checkpoint is kept (mid-training analyses)."""
    t2mlr_steps = int(tree["train"]["max_steps"])
    arms = {}
    for name in models:
        spec = arm_spec(name)
        overrides = [f"train.max_steps={steps_of(task, t2mlr_steps, name)}"]
        if name in keep_all_checkpoints:
            overrides.append("checkpoint.keep_last=null")
        common = {"directory": run_dir_name(name), "threads": task.torch_threads}
        if is_t2mlr_arm(name):
            if spec is not None:
                overrides += [f"model.l_start={spec.start}", f"model.l_end={spec.end}",
                              *(f"model.{key}={value}" for key, value in spec.path_settings().items())]
            arms[name] = arm_from_tree(tree, name, label_of(name), overrides, **common)
        else:
            arms[name] = matched_arm(tree, name, spec or name, label_of(name), overrides, task.lstm_layers, **common)
    return arms


# ---------------------------------------------------------------------------------------------- data


def data_settings(task: S5Task, seed: int) -> dict[str, Any]:
    """The settings the written data depend on (JSON-normalised, for comparison with meta.json)."""
    names = ("k", "dict_size", "alphabet", "train_n", "eval_n", "eval_size_per_n", "num_actions")
    return json.loads(json.dumps({**{name: getattr(task, name) for name in names}, "seed": seed}))


def prepare_data(task: S5Task, seed: int, data_dir: Path, echo: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Tokenizer, evaluation set and a training peek under `data_dir` (an earlier run's evaluation set of the
    same settings is reused); returns the tokenizer and the evaluation samples."""
    meta = data_dir / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("data") != data_settings(task, seed):
        raise ValueError(f"{data_dir} was generated for different data settings; use another --out or --overwrite")
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_s5_tokenizer(task.k, task.alphabet)
    tokenizer.save_pretrained(str(data_dir / "tokenizer"))
    spec = S5DataSpec(task.k, task.dict_size, task.alphabet, task.num_actions, seed)
    if (data_dir / "eval.jsonl").is_file():
        samples = read_jsonl(data_dir / "eval.jsonl")
    else:
        lo, hi = task.eval_n
        samples = [spec.sample((n, n), f"eval-n{n}", j)
                   for n in tqdm(range(lo, hi + 1), desc="eval data", unit="N", dynamic_ncols=True)
                   for j in range(task.eval_size_per_n)]
        write_jsonl(samples, data_dir / "eval.jsonl")
    peek = (spec.sample(task.train_n, "train", i) for i in range(min(TRAIN_PEEK, task.train_size)))
    write_jsonl(peek, data_dir / "train_sample.jsonl")
    actions = spec.action_set()
    meta.write_text(json.dumps({"data": data_settings(task, seed), "preset": echo,
                                "action_set": None if actions is None else [list(a) for a in actions]}, indent=2)
                    + "\n", encoding="utf-8")
    return tokenizer, samples


def filled_tree(task: S5Task, tree: dict[str, Any], tokenizer: Any, tokenizer_dir: Path) -> dict[str, Any]:
    """The config with what follows from the task: the backbone's vocabulary, special ids and positions (the
    full base section, as the T²MLR model's config records it), the data factory's keywords, the row length
    and the data seed (= train.seed)."""
    cfg = config_from_tree(tree)
    seed, (lo, hi) = cfg.train.seed, task.train_n
    base = build_base_config({**tree["model"]["base"], "vocab_size": len(tokenizer),
                              "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                              "eos_token_id": tokenizer.eos_token_id,
                              "max_position_embeddings": max(512, task.max_length())})
    filled = deep_merge(tree, {"data": {
        "kwargs": {"tokenizer": str(tokenizer_dir), "k": task.k, "dict_size": task.dict_size,
                   "alphabet": task.alphabet, "n_lo": lo, "n_hi": hi, "size": task.train_size,
                   "num_actions": task.num_actions, "seed": seed},
        "seq_len": task.max_length(), "seed": seed}})
    filled["model"]["base"] = base_section(base)
    return filled


def t2mlr_config(preset: str) -> Any:
    """The T²MLR model of a preset (`t2mlr params --preset s5-cpu`): its config filled in for the task's tokenizer."""
    tree, sections = load_sections(preset_config("s5", preset), [], {"task": S5Task})
    task = sections["task"]
    tokenizer = build_s5_tokenizer(task.k, task.alphabet)
    return t2mlr_of(config_from_tree(filled_tree(task, tree, tokenizer, Path("tokenizer"))))


def plan(preset: str, task: S5Task, tree: dict[str, Any], out: str | Path, models: Sequence[str] = MODEL_NAMES,
         resume: bool = False, overwrite: bool = False, keep_all_checkpoints: Sequence[str] = ()) -> S5Plan:
    """Check the models, claim the run directories, write the data and build every arm."""


    out, models = Path(out), tuple(models)
    check_models(models, int(tree["model"]["base"]["num_hidden_layers"]))
    steps = int(tree["train"]["max_steps"])
    for name in models:
        steps_of(task, steps, name)
    if claim_run_dirs(out, [run_dir_name(name) for name in models], resume=resume, overwrite=overwrite) and overwrite:
        shutil.rmtree(out / "data", ignore_errors=True)
    seed = int(tree["train"]["seed"])
    tqdm.write(f"[s5] preset {preset} (seed {seed}): data → {out / 'data'}")
    tokenizer, samples = prepare_data(task, seed, out / "data", echo(preset, task, tree))
    filled = filled_tree(task, tree, tokenizer, out / "data" / "tokenizer")
    return S5Plan(preset, task, filled, out, models, tokenizer, samples,
                  build_arms(task, filled, models, keep_all_checkpoints))


def dry_run_arms(task: S5Task, tree: dict[str, Any], out: str | Path, models: Sequence[str] = MODEL_NAMES,
                 keep_all_checkpoints: Sequence[str] = ()) -> tuple[dict[str, Arm], list[str]]:
    """The arms `plan` builds, without writing anything (`--dry-run`): the tokenizer depends on the task section
    only, so it is built in memory and every arm's config is the real run's. Returns the arms and what a
    sizing of them should say."""
    models = tuple(models)
    check_models(models, int(tree["model"]["base"]["num_hidden_layers"]))
    filled = filled_tree(task, tree, build_s5_tokenizer(task.k, task.alphabet), Path(out) / "data" / "tokenizer")
    notes = [f"data: S5 rows generated on demand (no files needed); rows of {task.max_length()} tokens, the longest "
             "evaluation row, as the real run pads them"]
    return build_arms(task, filled, models, keep_all_checkpoints), notes


def echo(preset: str, task: S5Task, tree: dict[str, Any]) -> dict[str, Any]:
    """What results.json and meta.json record of the settings: the preset's name, seed and steps, and the task
    section (every arm's whole trainer config is its run directory's config.yaml)."""
    steps = int(tree["train"]["max_steps"])
    return {"name": preset, "seed": int(tree["train"]["seed"]), **asdict(task),
            "steps": {name: steps_of(task, steps, name) for name in MODEL_NAMES}}


# ---------------------------------------------------------------------------------------------- this score


def forward_kwargs(model: Any, path: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The evaluation path, explicit: T²MLR's exact recurrence, or `path` when given (e.g. `{"recurrence":
    "jacobi", "d_forward": 8}`); nothing for the baselines (a path for a model without recurrence is an error).
    Never the config's default (docs/semantics.md §9)."""
    if not is_t2mlr(model):
        if path:
            raise ValueError(f"the evaluation path {dict(path)} applies to T²MLR models only")
        return {}
    return dict(path) if path else {"recurrence": "exact"}


def evaluate_by_n(model: Any, samples: Sequence[Mapping[str, Any]], tokenizer: Any, batch_size: int,
                  device: torch.device | str = "cpu", desc: str = "eval", path: Mapping[str, Any] | None = None,
                  env: DistEnv | None = None) -> dict[int, NMetrics]:
    """Per-N metrics (teacher-forced; T²MLR on the exact path, or on `path`): each model reads the whole input
    once, its prediction at position t is argmax(logits[t]), scored against target[t] after the delimiter
    (`t2mlr.tasks.scoring`). Rows of one N have one length, so batches need no padding. Under torchrun
    (`env`) the batches are shared out over the ranks and the scores gathered back in order."""
    def ids(tokens: Sequence[str]) -> list[int]:
        found = tokenizer.convert_tokens_to_ids(list(tokens))
        if any(i is None or i == tokenizer.unk_token_id for i in found):
            raise ValueError("an S5 sample has symbols missing from the tokenizer; regenerate data and tokenizer "
                             "together")
        return found

    kwargs = forward_kwargs(model, path)
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for sample in samples:
        groups.setdefault(int(sample["n"]), []).append(sample)
    batches = [(n, group[start : start + batch_size]) for n, group in sorted(groups.items())
               for start in range(0, len(group), batch_size)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), fixed_depth(model), tqdm(total=len(samples), desc=desc, unit="seq",
                                                       dynamic_ncols=True, disable=off_main_rank()) as bar:

            def score(batch: tuple[int, list[Mapping[str, Any]]]) -> list[tuple[int, Any]]:
                n, chunk = batch
                inputs = torch.tensor([ids(s["input_tokens"]) for s in chunk], device=device)
                predicted = model(input_ids=inputs, **kwargs).logits.argmax(dim=-1).cpu()
                bar.update(len(chunk))
                return [(n, score_s5_prediction(row, ids(sample["target_tokens"]), int(sample["score_start"])))
                        for sample, row in zip(chunk, predicted.tolist())]

            records = [record for part in shard_and_gather(batches, score, env) for record in part]
    finally:
        model.train(was_training)
    return {n: NMetrics(em, acc, count) for n, (em, acc, count) in aggregate_s5_by_n(records).items()}


def summarize(metrics: Mapping[int, NMetrics], lo: int, hi: int) -> tuple[float, float] | None:
    """Mean exact match and mean token accuracy over N in [lo, hi] (each N weighted equally)."""
    chosen = [m for n, m in metrics.items() if lo <= n <= hi]
    if not chosen:
        return None
    return (sum(m.exact_match for m in chosen) / len(chosen), sum(m.token_accuracy for m in chosen) / len(chosen))


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


def evaluate(plan: S5Plan, trained: Mapping[str, TrainedArm], env: DistEnv | None = None
             ) -> tuple[list[ModelResult], str]:
    """Per-N evaluation of every trained model (the others are left out), on the task's torch threads, shared
    out over the ranks under torchrun (`env`); returns the results and the device they ran on."""
    results, device_name = [], "cpu"
    with fixed_threads(plan.task.torch_threads):
        for name in [name for name in plan.models if name in trained]:
            model, device = load_trained(trained[name])
            device_name = str(device)
            started = time.perf_counter()
            per_n = evaluate_by_n(model, plan.eval_samples, plan.tokenizer, plan.arms[name].config.eval.batch_size,
                                  device, desc=f"eval {name}", env=env)
            results.append(ModelResult(
                name=name, label=label_of(name), parameters=count_parameters(model), steps=plan.steps(name),
                train_seconds=trained[name].seconds, eval_seconds=time.perf_counter() - started, per_n=per_n,
                train_path=describe_path(plan.arms[name].config), eval_path=forward_kwargs(model).get("recurrence", "plain")))
            del model
    return results, device_name


# ---------------------------------------------------------------------------------------------- report


def _fmt(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else percent(value)


def _span(lo: int, hi: int) -> str:
    return f"N {lo}" if lo == hi else f"N {lo}–{hi}"


def results_table(results: Sequence[ModelResult], task: S5Task) -> list[str]:
    """One row per model; EM and token accuracy over the training lengths and, when the evaluation goes further,
    beyond them."""
    lo, hi = task.train_n
    spans = [(lo, hi)] + ([(hi + 1, task.eval_n[1])] if hi < task.eval_n[1] else [])
    head = ["model", "trained on", "evaluated on", "parameters", "steps", "training time",
            *[f"{score} ({_span(*span)})" for span in spans for score in ("EM", "token acc")]]
    rows = []
    for r in results:
        scores = [summarize(r.per_n, *span) or (float("nan"), float("nan")) for span in spans]
        rows.append([r.label, r.train_path, r.eval_path, f"{r.parameters:,}", f"{r.steps:,}", minutes(r.train_seconds),
                     *[_fmt(score) for pair in scores for score in pair]])
    return table(head, rows, "lllrrr" + "rr" * len(spans))


def per_n_table(results: Sequence[ModelResult]) -> list[str]:
    ns = sorted({n for r in results for n in r.per_n})
    rows = []
    for n in ns:
        cells = [f"{_fmt(r.per_n[n].exact_match)} / {_fmt(r.per_n[n].token_accuracy)}" if n in r.per_n else "–"
                 for r in results]
        rows.append([n, *cells])
    return table(["N", *[f"{r.label} EM / tok" for r in results]], rows, "r" * (len(results) + 1))


def describe(plan: S5Plan) -> list[str]:
    """The settings lines of results.md: data, models, the compute-matched steps, metrics, the preset's notes."""
    task, cfg = plan.task, plan.arms[plan.models[0]].config if "t2mlr" not in plan.arms else plan.arms["t2mlr"].config
    t2mlr = plan.tree["model"]
    base = t2mlr["base"]
    actions = ("all 120 permutations of S5" if task.num_actions is None else
               f"a fixed {task.num_actions}-element generating set of S5 (see `t2mlr.tasks.s5.generating_set`)")
    drawn = max(plan.steps(name) for name in plan.models) * cfg.train.global_batch_size
    fresh = ("a fresh sequence for every training example" if task.train_size >= drawn else
             f"{task.train_size:,} training sequences, revisited")
    path = (f"Jacobi (d_forward = {t2mlr['d_forward']}, d_backward = {t2mlr['d_backward']})"
            if t2mlr["train_recurrence"] == "jacobi" else "the exact path")
    widths = {name: plan.arms[name].config.model.base["hidden_size"] for name in ("transformer", *RECURRENT_CELLS)
              if name in plan.arms}
    lines = [
        f"- Data: K = {task.k}, dictionary of {task.dict_size} of the 120 keys (resampled per sequence), "
        f"{len(task.alphabet)}-symbol value alphabet, actions from {actions}; training N uniform in "
        f"{task.train_n[0]}–{task.train_n[1]} ({fresh}), evaluation N {task.eval_n[0]}–{task.eval_n[1]} with "
        f"{task.eval_size_per_n} held-out sequences per N.",
        f"- Models: Llama backbone, {base['num_hidden_layers']} blocks, hidden {base['hidden_size']}, "
        f"{base['num_attention_heads']} heads of {base['head_dim']}, MLP {base['intermediate_size']}, RoPE. "
        f"T²MLR({t2mlr['l_start']},{t2mlr['l_end']}) trained on {path} (an arm spelt with its own path, e.g. "
        f"t2mlr:S-E:jacobi:F:B, on that path: see the table), evaluated on the exact path."
        + (f" Transformer: the same backbone widened to hidden {widths['transformer']}." if "transformer" in widths else "")
        + "".join(f" {LABELS[name].split()[0]}: {task.lstm_layers} layers, hidden {widths[name]}."
                  for name in RECURRENT_CELLS if name in widths)
        + f" {optimizer_settings(plan.tree, cfg.train.global_batch_size)}.",
    ]
    matched = next((name for name in plan.models if (spec := arm_spec(name)) and spec.budget == COMPUTE_MATCHED), None)
    if matched is not None:
        lines.append(f"- Compute-matched Transformer: {plan.steps(matched):,} steps = {task.compute_matched_ratio:g} × "
                     f"T²MLR's {int(plan.tree['train']['max_steps']):,}. {task.compute_matched_basis}")
    lines.append("- Metrics: teacher-forced transduction, argmax at each position against the target there, scored "
                 "after the delimiter only; EM = whole scored part right; columns average the per-N numbers (each N "
                 "weighted equally).")
    return lines + ([f"- Preset notes: {task.notes}"] if task.notes else [])


def finish(plan: S5Plan, trained: Mapping[str, TrainedArm], started: float, workers: int,
           failures: Mapping[str, str] | None = None, env: DistEnv | None = None) -> list[ModelResult]:
    """Evaluate the trained models and write results.md, results.json and accuracy_vs_length.png (under
    torchrun, `env`: every rank evaluates its share, rank 0 writes)."""
    results, device = evaluate(plan, trained, env)
    if env is not None and not env.is_main:
        return results
    if results:
        curves = {r.label: {n: (m.exact_match, m.token_accuracy) for n, m in r.per_n.items()} for r in results}
        plot_accuracy_vs_length(curves, plan.task.train_n, plan.out / FIGURE,
                                title=f"S5-Retrieval ({plan.preset} preset, seed {plan.seed})")
    wall = time.perf_counter() - started
    cpu_kernels = cpu_arithmetic()["cpu_kernels"]
    schedule = ("the models trained one after another" if workers <= 1 else
                f"the models trained {workers} at a time in worker processes, so their training times overlap")
    failures = dict(failures or {})
    lines = [
        "# S5-Retrieval: T²MLR vs parameter-matched baselines",
        "",
        (f"Preset `{plan.preset}`, seed {plan.seed}, device {device}, whole experiment (data, training, evaluation, "
         f"plot): {minutes(wall)}; {schedule}. Every run and the evaluation computed on {plan.task.torch_threads} "
         "torch thread(s) (fixed by the preset, so the numbers do not depend on the schedule or on the machine's "
         f"load; the times do), with torch's {cpu_kernels} CPU kernels (another CPU's kernel set can give other "
         "numbers)."),
        "",
        *describe(plan),
        "",
        *results_table(results, plan.task),
        "",
        f"![accuracy vs length]({FIGURE})",
        "",
        "## Per N (exact match / per-token accuracy)",
        "",
        *per_n_table(results),
        *(["", "## Runs that stopped", "", *[f"- {label_of(name)} (`{name}`): {message}"
                                              for name, message in failures.items()]] if failures else []),
    ]
    payload = {"preset": echo(plan.preset, plan.task, plan.tree), "wall_seconds": wall, "training_workers": workers,
               "torch_threads": plan.task.torch_threads, "cpu_kernels": cpu_kernels,
               "models": [{**asdict(r), "per_n": {str(n): asdict(m) for n, m in r.per_n.items()}} for r in results],
               "failed": failures}
    write_result(plan.out, "results", lines, payload)
    tqdm.write(f"[s5] wrote {plan.out / RESULTS_MD}, {plan.out / RESULTS_JSON} and {plan.out / FIGURE} ({minutes(wall)})")
    return results


def run(preset: str, task: S5Task, tree: dict[str, Any], out: str | Path, models: Sequence[str] = MODEL_NAMES,
        resume: bool = False, overwrite: bool = False, workers: int | None = None) -> list[ModelResult]:
    """Data → trainings (side by side in `workers` processes; default one per model up to the CPU threads) →
    per-N evaluation → results.md / results.json / accuracy_vs_length.png."""
    started = time.perf_counter()
    env = current_env(tree["train"].get("device", "auto"))
    experiment = computed_by_main(lambda: plan(preset, task, tree, out, models, resume, overwrite), env)
    workers = resolve_workers(workers, len(experiment.models), env.device)
    tqdm.write(f"[s5] training {', '.join(f'{label_of(n)} ({experiment.steps(n):,} steps)' for n in experiment.models)}"
               f" → {experiment.out}" + (f", {workers} at a time in worker processes" if workers > 1 else ""))
    trained, _ = train_arms(list(experiment.arms.values()), experiment.out, resume, workers)
    return finish(experiment, trained, started, workers, env=env)
