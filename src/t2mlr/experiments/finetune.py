"""The reasoning finetunes (paper §4.3, Figure "finetuning-multihop"): every arm on one task, pass@1.

These configs: `configs/experiments/finetune_{paper,cpu,tiny}_<task>.yaml`, each a trainer config of the
T²MLR arm plus the task section `FinetuneTask` (which task, its generator settings, the arms, the sizes and
where the arms start). From scratch, the non-T²MLR arms are parameter-matched to T²MLR
(`t2mlr.training.arms.matched_arm`); `--from` starts each arm from its own checkpoint (checked against the
arm before any training); `--retrofit MODEL` starts every arm from one pretrained model (its Transformer arm
is that model, so it is not parameter-matched: T²MLR adds its fusion parameters).

This data: the task's training and held-out records (`t2mlr.tasks.reasoning`: generated for variable
assignment and ProsQA-Hard, a local file or directory for GSM8K-Aug and HotpotQA), written to OUT/data, as
SFT rows with the prompt masked from the loss (`t2mlr.tasks.sft`).

This score: greedy generation of every held-out prompt in left-padded batches (`t2mlr.generation.text`;
T²MLR's prompt on the exact path unless the task says Jacobi), scored by the task's extractor: pass@1 with
its 95% Wilson interval. With `task.samples` n > 1, n replies per problem are sampled (`task.temperature`,
`task.top_p`, seeded by train.seed) and `task.pass_k` reports pass@k by the unbiased estimator
(`t2mlr.evaluation.generation`). OUT/results.md, OUT/results.json, OUT/pass_at_1.png and OUT/predictions.jsonl
(one line per arm, problem and sample: every generation with its prompt and score), from which
`rescore_predictions` recomputes every pass@k. `write_summary`
gathers several runs (tasks, seeds) into one table and one figure.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import AutoConfig

from t2mlr.analysis.figures import plot_pass_at_1
from t2mlr.analysis.report import minutes, optimizer_settings, percent, table, write_result
from t2mlr.baselines.matching import ModelSpec, count_parameters, parse_model_specs, t2mlr_parameter_count
from t2mlr.evaluation.generation import pass_at_k_table, replies_per_prompt
from t2mlr.experiments.sections import FinetuneTask
from t2mlr.model import T2MLRConfig, is_t2mlr
from t2mlr.model.configuration import build_base_config
from t2mlr.model.pretrained import load_pretrained_tokenizer
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.reasoning import get_task, load_task_data, score_output, task_label
from t2mlr.tasks.scoring import mean_pass_at_k
from t2mlr.tasks.sft import sft_row
from t2mlr.tasks.tokenizers import build_task_tokenizer
from t2mlr.training.arms import (
    Arm,
    TrainedArm,
    arm_from_tree,
    base_section,
    claim_run_dirs,
    load_trained,
    matched_arm,
    model_section,
    resolve_workers,
    train_arms,
)
from t2mlr.training.checkpoint import recorded_state
from t2mlr.training.config import config_from_tree, deep_merge
from t2mlr.training.distributed import DistEnv, computed_by_main, current_env, shard_and_gather
from t2mlr.training.metrics import read_metrics
from t2mlr.training.model_factory import build_model
from t2mlr.utils import cpu_arithmetic, load_tokenizer

__all__ = ["ArmResult", "DeclaredVocabulary", "FinetunePlan", "FinetuneTask", "StartingPoint", "dry_run_arms", "rescore_predictions", "run",
           "wilson_interval", "write_summary"]

RESULTS_MD, RESULTS_JSON, FIGURE, PREDICTIONS = "results.md", "results.json", "pass_at_1.png", "predictions.jsonl"
FINDINGS = "findings.md"  # a summary folder's hand-written reading of its runs: linked, never written
_WRAPPER_TYPES = {"t2mlr": "t2mlr", "looped": "t2mlr_looped", "pause": "t2mlr_pause"}


@dataclass(frozen=True)
class StartingPoint:
    """Where the arms start: "scratch", "from" (`checkpoints`: arm name -> directory), "retrofit" (`model`) or,
    in a dry run of a preset that starts from pretrained checkpoints none of which is given, "shape": each arm
    from a checkpoint of the preset's declared backbone (model.base), which is what sizing needs."""

    kind: str = "scratch"
    checkpoints: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def of(self, arm: str) -> str:
        if self.kind == "from":
            return self.checkpoints[arm]
        if self.kind == "shape":
            return "a pretrained checkpoint of the preset's backbone (dry run: its shape)"
        return f"retrofit of {self.model}" if self.kind == "retrofit" else "scratch"


@dataclass(frozen=True)
class FinetunePlan:
    """A finetune config plus the command line's choices: arms, data, start and evaluation prefill."""

    preset: str
    task: FinetuneTask
    tree: dict[str, Any]
    specs: tuple[ModelSpec, ...]
    start: StartingPoint = StartingPoint()
    data: str | None = None
    variant: str | None = None
    prefill_depth: int | None = None

    @property
    def seed(self) -> int:
        return int(self.tree["train"]["seed"])

    @property
    def steps(self) -> int:
        return int(self.tree["train"]["max_steps"])


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
    # How training and evaluation computed on the CPU (both fix the float summation order, so a seed's numbers
    # repeat only on the same): torch threads and kernel set (e.g. AVX512), training's as its last checkpoint
    # records them (None: not recorded)
    train_threads: int | None = None
    eval_threads: int | None = None
    train_cpu_kernels: str | None = None
    eval_cpu_kernels: str | None = None


def wilson_interval(correct: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion (sensible at 0% and 100%, unlike the normal one)."""
    if total <= 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


# ---------------------------------------------------------------------------------------------- the plan


def parse_arms(text: str) -> tuple[ModelSpec, ...]:
    """Arms as `t2mlr params` and the benchmarks name them; duplicates are refused."""
    specs = tuple(parse_model_specs(text))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--arms names an arm twice: {text!r}")
    return specs


def checkpoint_dirs(values: Sequence[str], specs: Sequence[ModelSpec]) -> dict[str, str]:
    """Arm name -> checkpoint directory from --from values: one directory holding a subdirectory per arm (named
    like the arm with ':' replaced by '_'; a trainer run directory's `final/` is used when present), or one
    ARM=DIR pair per arm."""
    names = {s.name for s in specs}
    if len(values) == 1 and "=" not in values[0]:
        root, found = Path(values[0]), {}
        for spec in specs:
            candidate = root / spec.dir_name
            if (candidate / "final" / "config.json").is_file():
                candidate = candidate / "final"
            if not candidate.is_dir():
                raise ValueError(f"--from {root}: no directory {spec.dir_name}/ for arm {spec.name}")
            found[spec.name] = str(candidate)
        return found
    pairs = {}
    for value in values:
        arm, sep, directory = value.partition("=")
        if not sep or not directory:
            raise ValueError(f"--from takes one directory or ARM=DIR pairs, got {value!r}")
        if arm not in names:
            raise ValueError(f"--from {value!r}: {arm!r} is not one of the arms {sorted(names)}")
        pairs[arm] = directory
    missing = sorted(names - set(pairs))
    if missing:
        raise ValueError(f"--from gives no checkpoint for arm(s) {missing}")
    return pairs


def make_plan(preset: str, task: FinetuneTask, tree: dict[str, Any], arms: str | None = None,
              from_: Sequence[str] | None = None, retrofit: str | None = None, data: str | None = None,
              variant: str | None = None, prefill_depth: int | None = None, dry_run: bool = False) -> FinetunePlan:
    """The experiment's plan from a config and the command line's choices; every check that needs no training.
    `dry_run`: a preset that starts from pretrained checkpoints is sized at its declared backbone when the
    command line names none."""
    specs = parse_arms(arms or ",".join(task.arms))
    if from_ and retrofit:
        raise ValueError("give either --from (each arm's own checkpoint) or --retrofit (one pretrained model)")
    if from_:
        start = StartingPoint("from", checkpoints=checkpoint_dirs(from_, specs))
    elif retrofit:
        start = StartingPoint("retrofit", model=retrofit)
    elif task.start != "scratch" and dry_run:
        start = StartingPoint("shape")
    elif task.start != "scratch":
        raise ValueError(f"the {preset} preset finetunes pretrained models: pass --from (each arm's own checkpoint) "
                         "or --retrofit MODEL")
    else:
        start = StartingPoint()
    if task.name != "gsm-aug" and variant is not None:
        raise ValueError("--variant applies to gsm-aug only")
    if prefill_depth is not None and task.prefill != "jacobi":
        raise ValueError("--prefill-depth applies to --prefill jacobi only")
    return FinetunePlan(preset, task, tree, specs, start, data, (variant or "symbolic") if task.name == "gsm-aug" else None,
                        prefill_depth)


def check_checkpoint_matches(spec: ModelSpec, config: Any, where: str) -> None:
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


def _model_from_checkpoint(spec: ModelSpec, directory: str, settings: dict[str, Any]) -> dict[str, Any]:

    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ValueError(f"--from for arm {spec.name}: {path} holds no config.json (a saved model or trainer checkpoint)")
    config = AutoConfig.from_pretrained(str(path))
    check_checkpoint_matches(spec, config, f"--from {path}")
    section = model_section(spec, config, settings)
    if spec.kind == "t2mlr":  # the checkpoint's own recurrence settings, the preset's training choices
        section.update({k: getattr(config, k) for k in ("d_forward", "d_backward") if hasattr(config, k)})
    return {**section, "init_from": str(path)}


def _retrofit_model(spec: ModelSpec, source: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The arm over a pretrained source, `{"pretrained": MODEL}`, or (a dry run: the shape, no weights) over
    `{"base": BASE}`: the arm a pretrained checkpoint of the backbone BASE would give."""
    own = {"t2mlr": lambda: {"l_start": spec.start, "l_end": spec.end, **settings},
           "looped": lambda: {"loop_blocks": spec.loop_blocks, "loops": spec.loops},
           "pause": lambda: {"pauses": spec.period - 1}}.get(spec.kind, dict)()
    return {"arch": spec.kind, **source, **own}


def build_arms(plan: FinetunePlan, tree: dict[str, Any]) -> tuple[list[Arm], int | None]:
    """Every arm of the plan and, from scratch, T²MLR's parameter count the other arms are matched to."""
    start = plan.start
    settings = {key: tree["model"][key] for key in ("d_forward", "d_backward", "train_recurrence", "eval_recurrence",
                                                    "recurrence_mask_policy")}  # the preset's, for started arms
    arms = []
    for spec in plan.specs:
        label = spec.label
        if spec.kind == "transformer" and start.kind in ("retrofit", "from"):  # not a width matched here
            label = "Transformer (the pretrained model)" if start.kind == "retrofit" else "Transformer (from its checkpoint)"
        if start.kind == "scratch" and spec.kind == "t2mlr":
            overrides = [f"model.l_start={spec.start}", f"model.l_end={spec.end}",
                         *(f"model.{key}={value}" for key, value in spec.path_settings().items())]
            arms.append(arm_from_tree(tree, spec.name, label, overrides, directory=spec.dir_name))
        elif start.kind == "scratch":
            arms.append(matched_arm(tree, spec.name, spec, label, directory=spec.dir_name))
        else:
            if start.kind == "shape":
                model = _retrofit_model(spec, {"base": tree["model"]["base"]}, settings)
            elif start.kind == "from":
                model = _model_from_checkpoint(spec, start.checkpoints[spec.name], settings)
            else:
                model = _retrofit_model(spec, {"pretrained": str(start.model)}, settings)
            arms.append(Arm(spec.name, label, config_from_tree({**tree, "model": model}), directory=spec.dir_name))
    if start.kind != "scratch":
        return arms, None
    base = build_base_config(tree["model"]["base"])
    return arms, t2mlr_parameter_count(T2MLRConfig.from_base(base, l_start=1, l_end=1))


def _check_before_training(arms: Sequence[Arm]) -> None:
    """Build every arm that starts from a checkpoint (loading its weights), so a bad one fails before training."""
    for arm in [arm for arm in arms if arm.config.model.init_from is not None]:
        try:
            build_model(arm.config.model)
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            raise ValueError(f"arm {arm.name}: its starting checkpoint does not fit the arm: {err}") from err


# ---------------------------------------------------------------------------------------------- this data


def _task_tokenizer(plan: FinetunePlan, train: list[dict[str, Any]]) -> Any:
    start = plan.start
    if start.kind == "scratch":
        spec = get_task(plan.task.name)
        # ProsQA with a fixed name pool: every concept is a training word, so whole words cover the evaluation
        syllables = spec.syllables and not plan.task.settings.get("name_pool")
        return build_task_tokenizer((r["prompt"] + r["target"] for r in train), spec.phrases, syllables)
    if start.kind == "retrofit":  # any pretrained source: hub id, directory, GGUF file or a shortcut name
        tokenizer = load_pretrained_tokenizer(str(start.model))
    else:
        tokenizer = load_tokenizer(start.checkpoints[plan.specs[0].name])
    if tokenizer.pad_token_id is None:  # left padding for batched generation needs a pad id; EOS is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prepare_data(plan: FinetunePlan, data_dir: Path) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """Data and tokenizer under `data_dir`; returns the tokenizer, the evaluation records and data facts."""
    task = plan.task
    train, evaluation, dropped = load_task_data(task.name, task.settings, task.train_size, task.eval_size, plan.seed,
                                                plan.data, plan.variant)
    tokenizer = _task_tokenizer(plan, train)
    kept = [r for r in tqdm(train, desc="check lengths", unit="row", dynamic_ncols=True, leave=False)
            if sft_row(tokenizer, r["prompt"], r["target"])["input_ids"].numel() <= task.max_length]
    if not kept:
        raise ValueError(f"every training row is longer than max_length {task.max_length} tokens")
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(data_dir / "tokenizer"))
    write_jsonl(kept, data_dir / "train.jsonl")
    write_jsonl(evaluation, data_dir / "eval.jsonl")
    facts = {"train_records": len(kept), "train_too_long": len(train) - len(kept), "eval_records": len(evaluation),
             "eval_dropped_seen_in_training": dropped, "vocab_size": len(tokenizer)}
    meta = {"task": task.name, "task_settings": task.settings, "seed": plan.seed, "data": plan.data,
            "variant": plan.variant, **facts}
    (data_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return tokenizer, evaluation, facts


def filled_tree(plan: FinetunePlan, tokenizer: Any, data_dir: Path) -> dict[str, Any]:
    """The config with its data (this run's train.jsonl and tokenizer, rows up to task.max_length, seeded by
    train.seed) and, from scratch, the backbone's vocabulary, special ids and positions."""
    task, tree = plan.task, plan.tree
    tokenizer_dir = str(data_dir / "tokenizer")
    filled = deep_merge(tree, {"data": {
        "kwargs": {"path": str(data_dir / "train.jsonl"), "tokenizer": tokenizer_dir,
                   "prompt_recurrence_mask": tree["model"].get("recurrence_mask_policy") == "mask"},
        "tokenizer": tokenizer_dir, "seq_len": task.max_length, "seed": plan.seed}})
    if plan.start.kind == "scratch":
        base = {"max_position_embeddings": max(512, task.max_length + task.max_new_tokens), **tree["model"]["base"],
                "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
        filled["model"]["base"] = base_section(build_base_config(base))
    return filled


@dataclass(frozen=True)
class DeclaredVocabulary:
    """What a dry run knows of the tokenizer a finetune from scratch builds from its data (no data is read):
    the vocabulary and special ids of the preset's model.base."""

    size: int
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None

    def __len__(self) -> int:
        return self.size


def dry_run_arms(plan: FinetunePlan, out: str | Path) -> tuple[list[Arm], list[str]]:
    """The arms `run` trains, built by the same functions on the same filled config, without reading or
    writing data (`--dry-run`); returns them and what their sizing rests on."""
    task, tree = plan.task, plan.tree
    notes = [f"data: not read in a dry run; every arm sized at data.seq_len = task.max_length = {task.max_length} "
             "tokens, the longest training row kept (most batches are shorter)"]
    vocabulary = None
    if plan.start.kind == "scratch":
        declared = "vocab_size" in tree["model"]["base"]
        base = build_base_config(tree["model"]["base"])
        vocabulary = DeclaredVocabulary(int(base.vocab_size), base.pad_token_id, base.bos_token_id, base.eos_token_id)
        notes.append(("vocabulary: " if declared else "vocabulary: the preset declares no model.base.vocab_size; ")
                     + f"sized at {base.vocab_size:,} tokens (the real run takes the size of the tokenizer it builds "
                     "from the training data)")
    elif plan.start.kind == "shape":
        notes.append("start: this preset finetunes pretrained checkpoints and the command names none (--from, "
                     "--retrofit): every arm sized as a checkpoint of the preset's backbone model.base would be")
    filled = filled_tree(plan, vocabulary, Path(out) / "data")
    arms, _ = build_arms(plan, filled)
    return arms, notes


# ---------------------------------------------------------------------------------------------- this score


def prediction_rows(task: str, arm: str, records: Sequence[dict[str, Any]],
                    replies: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The predictions file's lines for one arm: one per problem and reply (`replies[i]`: problem i's), with the
    fields the task's scorer reads; `draw` numbers a problem's replies when it has several."""
    fields = get_task(task).checker_fields
    rows = []
    for i, (record, texts) in enumerate(zip(records, replies)):
        for draw, text in enumerate(texts):
            scored = score_output(task, record, text)
            numbered = {"draw": draw} if len(texts) > 1 else {}
            rows.append({"arm": arm, "index": i, **numbered, "prompt": record["prompt"], "gold": record["answer"],
                         "generated": text, "extracted": scored.extracted, "correct": scored.correct, **scored.extra,
                         **({"sample": {k: record[k] for k in fields}} if fields else {})})
    return rows


def correct_counts(rows: Sequence[dict[str, Any]]) -> tuple[list[int], int]:
    """Right replies per problem of one arm's rows, and the replies each problem has (equal for all)."""
    by_problem: dict[Any, list[bool]] = {}
    for row in rows:
        by_problem.setdefault(row["index"], []).append(bool(row["correct"]))
    sizes = {len(verdicts) for verdicts in by_problem.values()}
    if len(sizes) != 1:
        raise ValueError(f"the problems have different numbers of replies ({sorted(sizes)}): pass@k needs the same n")
    return [sum(verdicts) for verdicts in by_problem.values()], sizes.pop()


def rescore_predictions(task: str, path: str | Path, k: int = 1) -> dict[str, float]:
    """pass@k per arm recomputed from a predictions file's generated texts (not its `correct` column)."""
    rescored: dict[str, list[dict[str, Any]]] = {}
    for line, row in enumerate(read_jsonl(path)):
        record = {**row.get("sample", {}), "answer": row["gold"]}
        verdict = score_output(task, record, row["generated"]).correct
        problem = row.get("index", f"line {line}")  # a row without its problem's index stands alone
        rescored.setdefault(row["arm"], []).append({"index": problem, "correct": verdict})
    return {arm: mean_pass_at_k(*correct_counts(rows), k) for arm, rows in rescored.items()}


def evaluate(plan: FinetunePlan, trained: TrainedArm, tokenizer: Any, records: Sequence[dict[str, Any]],
             env: DistEnv | None = None) -> tuple[ArmResult, list[dict[str, Any]], str]:
    """One arm's greedy replies, scored: its result, its prediction rows and the device it ran on. Under
    torchrun (`env`) the generation batches are shared out over the ranks, and every rank gets every reply."""
    model, device = load_trained(trained)
    arm, task = trained.arm, plan.task
    jacobi = task.prefill == "jacobi" and is_t2mlr(model)
    sampling = task.sampling()
    settings = sampling.generation_settings(max_new_tokens=task.max_new_tokens, prefill="jacobi" if jacobi else "exact",
                                            prefill_depth=plan.prefill_depth if jacobi else None)
    started = time.perf_counter()
    replies = replies_per_prompt(model, tokenizer, [r["prompt"] for r in records], sampling, settings,
                                 arm.config.eval.batch_size, plan.seed, desc=f"eval {arm.name}",
                                 map_batches=partial(shard_and_gather, env=env))
    eval_seconds = time.perf_counter() - started
    rows = prediction_rows(task.name, arm.name, records, replies)
    correct = sum(r["correct"] for r in rows)
    extra_keys = [k for k in rows[0] if k in ("f1", "answer_correct")]
    pass_k = pass_at_k_table(*correct_counts(rows), sampling.pass_k) if sampling.sampled else {}
    tokens = max((int(r.get("tokens_seen", 0)) for r in read_metrics(trained.run_dir)), default=0)
    trained_on, evaluated_on = recorded_state(trained.run_dir), cpu_arithmetic()
    result = ArmResult(
        arm=arm.name, label=arm.label, parameters=count_parameters(model), start=plan.start.of(arm.name),
        steps=arm.config.train.max_steps, tokens=tokens, train_seconds=trained.seconds, eval_seconds=eval_seconds,
        correct=correct, total=len(rows), pass_at_1=correct / len(rows), interval=wilson_interval(correct, len(rows)),
        extra={**{k: sum(r[k] for r in rows) / len(rows) for k in extra_keys},
               **{f"pass@{k}": value for k, value in pass_k.items()}},
        train_threads=trained_on.get("torch_threads"), eval_threads=evaluated_on["torch_threads"],
        train_cpu_kernels=trained_on.get("cpu_kernels"), eval_cpu_kernels=evaluated_on["cpu_kernels"])
    return result, rows, str(device)


# ---------------------------------------------------------------------------------------------- report


def echo(plan: FinetunePlan) -> dict[str, Any]:
    """What results.json records of the settings: the preset, seed and steps, and the task section (every
    arm's whole trainer config is its run directory's config.yaml)."""
    task = {k: v for k, v in asdict(plan.task).items() if k not in ("name", "settings")}
    return {"name": plan.preset, "task": plan.task.name, "task_settings": plan.task.settings, **task,
            "seed": plan.seed, "steps": plan.steps}


def results_table(results: Sequence[ArmResult]) -> list[str]:
    extras = sorted({k for r in results for k in r.extra})
    head = ["arm", "parameters", "start", "steps", "tokens", "training time", "pass@1", "95% interval", *extras]
    rows = [[r.label, f"{r.parameters:,}", r.start, f"{r.steps:,}", f"{r.tokens:,}", minutes(r.train_seconds),
             f"{percent(r.pass_at_1)} ({r.correct}/{r.total})", "–".join(map(percent, r.interval)),
             *[percent(r.extra.get(k, float("nan"))) for k in extras]] for r in results]
    return table(head, rows, "lrlrrrrl" + "r" * len(extras))


def _settings_line(plan: FinetunePlan, workers: int) -> str:
    t, model = plan.tree, plan.tree["model"]
    mask = ("on (T²MLR fuses R into target tokens only)" if model.get("recurrence_mask_policy") == "mask"
            else "off (every token fuses R)")
    prefill = plan.task.prefill + (f" (depth {plan.prefill_depth or model['d_forward']})"
                                   if plan.task.prefill == "jacobi" else "")
    path = (f"jacobi path ({model['d_forward']}, {model['d_backward']})" if model["train_recurrence"] == "jacobi"
            else "exact path")
    return (f"{optimizer_settings(t, t['train']['global_batch_size'])}, {plan.steps:,} steps, seed {plan.seed}; "
            f"T²MLR trained on the {path}; prompt recurrence mask {mask}; evaluation: "
            f"{plan.task.sampling().describe()}, {plan.task.max_new_tokens} new tokens at most, batches of "
            f"{t['eval']['batch_size']} left-padded prompts, T²MLR prefill {prefill}; "
            + (f"arms trained {workers} at a time." if workers > 1 else "arms trained in turn."))


def _arithmetic_line(results: Sequence[ArmResult]) -> str:
    """Each arm's torch threads and CPU kernels in training and evaluation: they fix the float summation
    order, so a seed's numbers repeat only on the same (findings: AVX2 and AVX512 trained ProsQA-Hard's
    Transformer to 33.3% and 8.0% from one seed)."""
    def on(threads: int | None, kernels: str | None) -> str:
        return f"{'?' if threads is None else threads} thread(s), {kernels or '?'} kernels"

    return "; ".join(f"{r.label} trained on {on(r.train_threads, r.train_cpu_kernels)}, evaluated on "
                     f"{on(r.eval_threads, r.eval_cpu_kernels)}" for r in results) + "."


def _pass_at_k_line(task: FinetuneTask) -> str:
    if not task.sampling().sampled:
        return ("- pass@1: one greedy sample per problem scored by the task's extractor; the interval is the 95% "
                "Wilson score interval over the problems.")
    return (f"- pass@k: {task.samples} sampled replies per problem scored by the task's extractor; pass@k "
            f"({', '.join(map(str, task.pass_k))}) is the unbiased estimator 1 − C(n − c, k) / C(n, k) averaged "
            "over problems; the pass@1 column is the mean over every reply, its 95% Wilson interval over the replies "
            "(those of one problem are correlated, so it is narrower than an interval over problems).")


def write_results(out: Path, plan: FinetunePlan, results: Sequence[ArmResult], facts: dict[str, Any], wall: float,
                  device: str, workers: int, target: int | None) -> None:
    task = plan.task
    label = task_label(task.name, plan.variant)
    matched = (f"non-T²MLR arms parameter-matched to T²MLR's {target:,} parameters" if target is not None
               else "arms as their checkpoints are (not re-matched)")
    lines = [
        f"# Reasoning finetune: {label}",
        "",
        f"Preset `{plan.preset}`, device {device}, whole experiment: {minutes(wall)}.",
        "",
        f"- Data: {facts['train_records']:,} training records ({facts['train_too_long']} longer than "
        f"{task.max_length} tokens left out), {facts['eval_records']} held-out evaluation problems "
        f"({facts['eval_dropped_seen_in_training']} dropped as seen in training); task settings "
        f"{json.dumps(task.settings)}" + (f"; data {plan.data}" if plan.data else "") + ".",
        f"- Models: {matched}; SFT with the prompt masked from the loss.",
        f"- Training and evaluation: {_settings_line(plan, workers)}",
        f"- CPU arithmetic: {_arithmetic_line(results)}",
        _pass_at_k_line(task),
        *([f"- Preset notes: {task.notes}"] if task.notes else []),
        "",
        *results_table(results),
        "",
        f"![pass@1]({FIGURE})",
        "",
        f"Predictions (prompt, gold, generated text, extracted answer, correct): `{PREDICTIONS}`.",
    ]
    payload = {"task": task.name, "variant": plan.variant, "label": label, "preset": echo(plan),
               "arms": [s.name for s in plan.specs], "start": asdict(plan.start), "data": plan.data,
               "prefill_depth": plan.prefill_depth, "data_facts": facts, "wall_seconds": wall, "device": device,
               "training_workers": workers, "matched_parameters": target, "results": [asdict(r) for r in results]}
    write_result(out, "results", lines, payload)
    bars = {label: {r.label: [(r.pass_at_1, *r.interval)] for r in results}}
    plot_pass_at_1(bars, out / FIGURE, title=f"{label} ({plan.preset} preset, seed {plan.seed})")


def run(plan: FinetunePlan, out: str | Path, resume: bool = False, overwrite: bool = False,
        workers: int | None = None) -> list[ArmResult]:
    """Data → one training per arm (side by side in `workers` processes on a CPU) → batched greedy evaluation
    → results (see the module docstring). Under torchrun rank 0 writes the data and the results, every arm
    trains over every rank and the evaluation is shared out (docs/scale.md)."""
    started, out = time.perf_counter(), Path(out)
    env = current_env(plan.tree["train"].get("device", "auto"))

    def prepare() -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
        claim_run_dirs(out, [s.dir_name for s in plan.specs], resume=resume, overwrite=overwrite)
        tqdm.write(f"[finetune] {plan.task.name}, preset {plan.preset}: data → {out / 'data'}")
        return prepare_data(plan, out / "data")

    tokenizer, records, facts = computed_by_main(prepare, env)
    arms, target = build_arms(plan, filled_tree(plan, tokenizer, out / "data"))
    _check_before_training(arms)
    workers = resolve_workers(workers, len(arms), env.device)
    tqdm.write(f"[finetune] training {', '.join(a.label for a in arms)} ({plan.steps:,} steps each) → {out}"
               + (f", {workers} at a time" if workers > 1 else ""))
    trained, _ = train_arms(arms, out, resume, workers)
    results, rows, device = [], [], "cpu"
    for arm in arms:
        result, arm_rows, device = evaluate(plan, trained[arm.name], tokenizer, records, env)
        results.append(result)
        rows.extend(arm_rows)
    if not env.is_main:
        return results
    write_jsonl(rows, out / PREDICTIONS)
    wall = time.perf_counter() - started
    write_results(out, plan, results, facts, wall, device, workers, target)
    tqdm.write(f"[finetune] wrote {out / RESULTS_MD}, {out / RESULTS_JSON}, {out / FIGURE}, {out / PREDICTIONS} "
               f"({minutes(wall)})")
    return results


# ---------------------------------------------------------------------------------------------- several runs


def _task_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    seeds = [r["preset"]["seed"] for r in runs]
    arms = list(dict.fromkeys(a["label"] for r in runs for a in r["results"]))
    rows = []
    for arm in arms:
        found = [next((a for a in run["results"] if a["label"] == arm), None) for run in runs]  # None: not in that run
        values = [a["pass_at_1"] for a in found if a is not None]
        cells = ["–" if a is None else f"{percent(a['pass_at_1'])} ({'–'.join(map(percent, a['interval']))})"
                 for a in found]
        spread = f"{percent(min(values))}–{percent(max(values))}" if len(values) > 1 else "–"
        rows.append([arm, *cells, percent(sum(values) / len(values)), spread])
    head = ["arm", *[f"seed {s} pass@1 (95% interval)" for s in seeds], "mean", "seed spread"]
    return table(head, rows, "l" + "r" * (len(seeds) + 2))


def write_summary(runs: Sequence[Path], out: Path) -> dict[str, list[dict[str, Any]]]:
    """Several finetune runs (tasks × seeds) in one report: a table per task with every seed and the spread, and
    the paper's figure layout (one bar group per task, one bar per arm, seeds as dots). Each run's results.md,
    results.json and predictions.jsonl are copied to OUT/<task>_seed<k>/ so the report is self-contained. Words
    written by hand about the runs belong in OUT/findings.md, which the summary links and never writes."""
    loaded = []
    for run in map(Path, runs):
        if not (run / RESULTS_JSON).is_file():
            raise FileNotFoundError(f"{run} has no {RESULTS_JSON}: not a finished `t2mlr experiment finetune` run")
        loaded.append((run, json.loads((run / RESULTS_JSON).read_text(encoding="utf-8"))))
    by_key: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for _, payload in loaded:  # grouped by task (and GSM variant); the first run's label names the group
        by_key.setdefault((payload["task"], payload.get("variant")), []).append(payload)
    by_task = {group[0]["label"]: group for group in by_key.values()}
    out.mkdir(parents=True, exist_ok=True)
    for run, payload in loaded:
        target = out / f"{payload['task']}_seed{payload['preset']['seed']}"
        if target.resolve() == run.resolve():  # the run's report already sits where the summary keeps it
            continue
        target.mkdir(exist_ok=True)
        for name in (RESULTS_MD, RESULTS_JSON, PREDICTIONS, FIGURE):
            shutil.copyfile(run / name, target / name)
    lines = ["# Reasoning finetunes: summary", ""]
    for label, task_runs in by_task.items():
        first = task_runs[0]
        lines += [f"## {label}", "",
                  f"Preset `{first['preset']['name']}`, {first['data_facts']['eval_records']} held-out problems per "
                  f"seed, {first['preset']['steps']:,} training steps per arm; per-seed reports in "
                  + ", ".join(f"`{first['task']}_seed{r['preset']['seed']}/`" for r in task_runs) + ".", "",
                  *_task_table(task_runs), ""]
    lines.append(f"![pass@1]({FIGURE})")
    if (out / FINDINGS).is_file():
        lines += ["", f"What the numbers say, written by hand after the runs: [{FINDINGS}]({FINDINGS})."]
    write_result(out, "results", lines, {label: [{"seed": r["preset"]["seed"], "results": r["results"]}
                                                 for r in task_runs] for label, task_runs in by_task.items()})
    bars: dict[str, dict[str, list[tuple[float, float, float]]]] = {label: {} for label in by_task}
    for label, task_runs in by_task.items():
        for run in task_runs:
            for arm in run["results"]:
                bars[label].setdefault(arm["label"], []).append((arm["pass_at_1"], *arm["interval"]))
    plot_pass_at_1(bars, out / FIGURE, title="Reasoning finetunes: pass@1, 95% intervals, dots = seeds")
    return by_task
