"""The paper's retrofit experiment: T²MLR retrofitted into a pretrained model, finetuned beside the unchanged
model, both scored on held-out problems.

These configs: `configs/experiments/retrofit_{paper,cpu,tiny}.yaml`, the T²MLR arm's trainer config (its
model.pretrained the source) plus the task section `RetrofitTask` (the data sources and sizes, the reply
length). The
Transformer arm is the same tree with `model.arch: transformer`: the pretrained model itself, finetuned
with the same rows in the same order, steps, optimiser and seed.

This data: finetuning and held-out records `{prompt, target, answer}` (`t2mlr.tasks.loaders`: generated
GSM-Aug-format problems, or local OpenMathReasoning, GSM8K and MATH-500 files), prompts masked from the loss
(`t2mlr.tasks.sft`, no BOS: the pretrained model's own chat-free prompt format).

This score: batched greedy replies (`t2mlr.generation.text`, T²MLR on its exact path) of the pretrained
model before finetuning and of both finetuned arms, scored by lm-evaluation-harness's GSM8K metrics
(strict-match, the headline, and flexible-extract) or, for MATH-500, by the boxed answer after MATH's
normalisation and by math-verify's equivalence (`t2mlr.tasks.scoring`). OUT/results.md, OUT/results.json,
OUT/predictions/<model>.jsonl, OUT/retrofit.png and one training run per arm (OUT/runs/<arm>, final/ loads with
`t2mlr generate`).
`write_summary` re-scores several runs' saved replies with every metric (retrofit-summary).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from t2mlr.analysis.figures import plot_retrofit
from t2mlr.analysis.report import table, write_result
from t2mlr.baselines.matching import count_parameters
from t2mlr.experiments.sections import RetrofitTask
from t2mlr.generation.text import GenerationSettings, generate_batched
from t2mlr.model.pretrained import load_pretrained_base
from t2mlr.tasks import loaders, scoring
from t2mlr.tasks.arithmetic import arithmetic_retrofit_records
from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.training.arms import arm_from_tree, load_trained, matched_arm, train_arms
from t2mlr.training.config import config_from_tree, deep_merge
from t2mlr.training.distributed import DistEnv, computed_by_main, current_env, shard_and_gather
from t2mlr.training.metrics import optimizer_step_seconds, read_metrics
from t2mlr.training.sizing import sizing_base_config

__all__ = ["ARMS", "EVAL_METRICS", "RetrofitTask", "dry_run_arms", "rescore_run", "run", "score_reply", "seeds_summary",
           "write_summary"]

ARMS = ("transformer", "t2mlr")
MODELS = ("base", *ARMS)
# The metrics of each kind of evaluation data, the headline (in results.md's first column and the figure) first.
EVAL_METRICS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("strict_match", "flexible_extract"),
    "gsm8k": ("strict_match", "flexible_extract"),
    "math500": ("math_equiv", "math_verify"),
}
METRIC_LABELS = {"strict_match": "strict-match (####, The answer is)", "flexible_extract": "flexible-extract (last number)",
                 "math_equiv": "boxed answer, MATH normalisation",
                 "math_verify": "boxed answer, math-verify equivalence"}
ARM_LABELS = {"base": "pretrained, not finetuned", "transformer": "finetuned base (baseline)",
              "t2mlr": "finetuned T²MLR retrofit"}


# ------------------------------------------------------------------------------------------ this data


def build_records(task: RetrofitTask, seed: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The finetuning and evaluation records of the task's data sources."""
    if task.train_data == "arithmetic":
        train = arithmetic_retrofit_records(task.train_problems, "train", seed, task.arithmetic)
    else:
        train = loaders.openmathreasoning_records(task.train_path, task.train_problems)
    if task.eval_data == "arithmetic":
        evaluation = arithmetic_retrofit_records(task.eval_problems, "eval", seed, task.arithmetic)
    elif task.eval_data == "math500":
        evaluation = loaders.math500_records(task.eval_path, task.eval_problems)
    else:
        evaluation = loaders.gsm8k_records(task.eval_path, task.eval_problems)
    if not evaluation:
        raise ValueError(f"no evaluation problems: {task.eval_path or task.eval_data} has no rows")
    return train, evaluation


def prepare_base(tree: dict[str, Any], out: Path) -> tuple[Path, float]:
    """The pretrained model (model.pretrained, model.gguf_file) and its tokenizer saved once as a Hugging Face
    directory (reused when present), so both arms start from the very same weights; returns it and the seconds
    the load took (0 when reused)."""
    base_dir = out / "base"
    if (base_dir / "config.json").is_file():
        return base_dir, 0.0
    start = time.perf_counter()
    model, tokenizer = load_pretrained_base(tree["model"]["pretrained"], gguf_file=tree["model"].get("gguf_file"))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    staging = out / "base.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(base_dir)
    return base_dir, time.perf_counter() - start


def build_arms(task: RetrofitTask, tree: dict[str, Any], base_dir: Path | str, train_file: Path, pad_token_id: int,
               gguf_file: str | None = None) -> list:
    """The Transformer arm (the pretrained model itself) and the T²MLR retrofit, differing only in `model`
    (`base_dir`: the saved copy of the source, or, in a dry run, the source with its `gguf_file`)."""
    mask = tree["model"].get("recurrence_mask_policy") == "mask"
    filled = deep_merge(tree, {
        "model": {"pretrained": str(base_dir), "gguf_file": gguf_file},
        "data": {"seq_len": task.max_length, "pad_token_id": pad_token_id, "seed": int(tree["train"]["seed"]),
                 "kwargs": {"path": str(train_file), "tokenizer": str(base_dir), "max_length": task.max_length,
                            "prompt_recurrence_mask": mask, "bos": False}}})
    return [matched_arm(filled, "transformer", "transformer", ARM_LABELS["transformer"],
                        ["logging.progress_label=finetune transformer"]),
            arm_from_tree(filled, "t2mlr", ARM_LABELS["t2mlr"], ["logging.progress_label=finetune t2mlr"])]


def dry_run_arms(task: RetrofitTask, tree: dict[str, Any], out: Path) -> tuple[list, list[str]]:
    """Both arms as `run` builds them, on the source itself instead of its saved copy under OUT/base (the same
    shapes), without loading weights or reading data (`--dry-run`); returns them and what their sizing rests on."""
    source, gguf_file = tree["model"]["pretrained"], tree["model"].get("gguf_file")
    config, _ = sizing_base_config(config_from_tree(tree).model)
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    notes = [f"data: not read in a dry run; both arms sized at data.seq_len = task.max_length = {task.max_length} "
             "tokens, the longest training row kept (most batches are shorter)",
             "the real run first evaluates the pretrained model and evaluates each arm after training: generation, "
             "not sized here"]
    return build_arms(task, tree, source, out / "data" / "train.jsonl", pad, gguf_file), notes


# ------------------------------------------------------------------------------------------ this score


def score_reply(eval_data: str, reply: str, answer: str) -> dict[str, dict[str, Any]]:
    """Every metric of the evaluation data on one reply: {metric: {"extracted", "correct"}}."""
    readers = {"strict_match": (scoring.gsm8k_strict_extract, scoring.gsm8k_match),
               "flexible_extract": (scoring.gsm8k_flexible_extract, scoring.gsm8k_match),
               "math_equiv": (scoring.extract_math_answer, scoring.math_match),
               "math_verify": (scoring.extract_math_answer, scoring.math_verify_match)}
    scores = {}
    for metric in EVAL_METRICS[eval_data]:
        extract, match = readers[metric]
        extracted = extract(reply)
        scores[metric] = {"extracted": extracted, "correct": match(extracted, answer)}
    return scores


def evaluate_greedy(model: Any, tokenizer: Any, records: Sequence[dict[str, str]], max_new_tokens: int,
                    batch_size: int, label: str = "eval", eval_data: str = "arithmetic",
                    env: DistEnv | None = None) -> list[dict[str, Any]]:
    """Greedy replies to every record's prompt, scored by every metric of `eval_data`; `correct` is the
    headline metric's verdict (a T²MLR model's prompt on the exact path, masked from the fusion when its
    recurrence_mask_policy is "mask", as in training). Under torchrun (`env`) the batches are
    shared out over the ranks, and every rank gets every reply."""
    replies = generate_batched(model, tokenizer, [r["prompt"] for r in records],
                               GenerationSettings(max_new_tokens=max_new_tokens), batch_size, bos=False,
                               desc=f"evaluate {label}", map_batches=partial(shard_and_gather, env=env))
    predictions = []
    for record, reply in zip(records, replies):
        scores = score_reply(eval_data, reply, record["answer"])
        headline = scores[EVAL_METRICS[eval_data][0]]
        predictions.append({"prompt": record["prompt"], "answer": record["answer"], "reply": reply,
                            "extracted": headline["extracted"], "correct": headline["correct"], "scores": scores})
    return predictions


def model_scores(predictions: Sequence[dict[str, Any]], eval_data: str) -> dict[str, Any]:
    """One model's numbers from its scored replies: the headline accuracy and solved count, and every metric's."""
    metrics = {}
    for metric in EVAL_METRICS[eval_data]:
        solved = sum(p["scores"][metric]["correct"] for p in predictions)
        metrics[metric] = {"accuracy": solved / max(1, len(predictions)), "solved": solved}
    headline = metrics[EVAL_METRICS[eval_data][0]]
    return {"accuracy": headline["accuracy"], "solved": headline["solved"], "metrics": metrics}


# ------------------------------------------------------------------------------------------ the run


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; pass --overwrite to replace it or choose another --out")
        for name in ("runs", "predictions", "results.md", "results.json", "retrofit.png", "data"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)


def run(preset: str, task: RetrofitTask, tree: dict[str, Any], out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Run the whole experiment into `out` and return what results.json holds. Under torchrun rank 0 reads the
    data, saves the base and writes every result, both arms train over every rank and every evaluation is
    shared out over the ranks (docs/scale.md)."""
    seed = int(tree["train"]["seed"])
    env = current_env(tree["train"].get("device", "auto"))
    started = time.perf_counter()

    def prepare() -> tuple[list[dict[str, str]], int, Path, float]:
        train_records, eval_records = build_records(task, seed)  # bad data fails before any weight is loaded
        _check_out(out, overwrite)
        base_dir, load_seconds = prepare_base(tree, out)
        write_jsonl(train_records, out / "data" / "train.jsonl")
        write_jsonl(eval_records, out / "data" / "eval.jsonl")
        return eval_records, len(train_records), base_dir, load_seconds

    eval_records, train_rows, base_dir, load_seconds = computed_by_main(prepare, env)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    train_file = out / "data" / "train.jsonl"

    def evaluate(name: str, model: Any) -> dict[str, Any]:
        predictions = evaluate_greedy(model, tokenizer, eval_records, task.max_new_tokens,
                                      int(tree["eval"]["batch_size"]), name, task.eval_data, env)
        if env.is_main:
            write_jsonl(predictions, out / "predictions" / f"{name}.jsonl")
        return model_scores(predictions, task.eval_data)

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32").to(env.device)
    models = {"base": evaluate("base", base)}
    del base
    for arm in build_arms(task, tree, base_dir, train_file, tokenizer.pad_token_id):
        train_start = time.perf_counter()
        trained = train_arms([arm], out / "runs")[0][arm.name]
        train_and_save_seconds = time.perf_counter() - train_start  # wall clock: setup, steps, checkpoints, export
        model, _ = load_trained(trained)
        eval_start = time.perf_counter()
        scores = evaluate(arm.name, model)
        records = [r for r in read_metrics(trained.run_dir) if r.get("split") == "train"]
        models[arm.name] = {**scores, "eval_seconds": time.perf_counter() - eval_start,
                            "train_seconds": optimizer_step_seconds(records),
                            "train_and_save_seconds": train_and_save_seconds, "tokens_seen": records[-1]["tokens_seen"],
                            "steps": records[-1]["step"], "losses": [r["loss"] for r in records],
                            "parameters": count_parameters(model), "run_dir": str(trained.run_dir)}
        del model
    results = {"preset": {"name": preset, "seed": seed, "steps": int(tree["train"]["max_steps"]),
                          "source": tree["model"]["pretrained"], "gguf_file": tree["model"].get("gguf_file"),
                          **asdict(task)}, "metrics": list(EVAL_METRICS[task.eval_data]),
               "eval_problems": len(eval_records), "train_rows": train_rows, "base_load_seconds": load_seconds,
               "total_seconds": time.perf_counter() - started, "models": models}
    if env.is_main:
        write_result(out, "results", results_markdown(results, tree), results)
        plot_retrofit({ARM_LABELS[name]: models[name]["accuracy"] for name in MODELS},
                      {ARM_LABELS[arm]: models[arm]["losses"] for arm in ARMS},
                      f"accuracy ({METRIC_LABELS[results['metrics'][0]]})", out / "retrofit.png")
    return results


# ------------------------------------------------------------------------------------------ report


def _metric_cell(m: dict[str, Any], metric: str, problems: int) -> str:
    value = m["metrics"][metric]
    return f"{value['accuracy']:.3f} ({value['solved']}/{problems})"


def results_markdown(results: dict[str, Any], tree: dict[str, Any]) -> list[str]:
    p, models, metrics = results["preset"], results["models"], results["metrics"]
    model, optim, train = tree["model"], tree["optim"], tree["train"]
    masked = model.get("recurrence_mask_policy") == "mask"
    lines = [
        f"# Retrofit experiment ({p['name']} preset, seed {p['seed']})",
        "",
        (f"T²MLR({model['l_start']},{model['l_end']}) retrofitted into `{p['source']}`; both arms finetuned with the "
         f"same {results['train_rows']} rows, {train['max_steps']} steps of batch {train['global_batch_size']}, AdamW "
         f"lr {optim['lr']} (betas {tuple(optim['betas'])}, weight decay {optim['weight_decay']}, cosine, warmup "
         f"{tree['schedule']['warmup_steps']}), seed {p['seed']}; prompts masked from the loss"
         f"{', and from the recurrence' if masked else ''}. T²MLR trains on the Jacobi path (d_forward "
         f"{model['d_forward']}, d_backward {model['d_backward']}) and answers on the exact path. Accuracy of greedy "
         f"replies on {results['eval_problems']} held-out problems ({p['eval_data']}), by each metric "
         "(`t2mlr.tasks.scoring`); the first is the headline."),
        "",
    ]
    rows = []
    for name in MODELS:
        m = models[name]
        loss = f"{sum(m['losses'][-5:]) / len(m['losses'][-5:]):.4f}" if m.get("losses") else "–"
        rows.append([ARM_LABELS[name], *[_metric_cell(m, metric, results["eval_problems"]) for metric in metrics],
                     f"{m.get('train_seconds', 0):.0f}", m.get("tokens_seen", 0), loss])
    head = ["model", *[METRIC_LABELS[m] for m in metrics], "training time (s, optimizer steps)", "tokens seen",
            "final training loss"]
    lines += table(head, rows)
    return lines + ["", f"Whole run: {results['total_seconds'] / 60:.1f} min. Final loss: mean of the last 5 steps."]


def seeds_summary(results: Sequence[dict[str, Any]], metric: str) -> str:
    """Markdown table of one metric over several seeds' results side by side, with each model's mean and the
    spread (max - min) across seeds, and the T²MLR-minus-baseline gap per seed."""
    seeds = [r["preset"]["seed"] for r in results]
    rows = []
    for name in MODELS:
        values = [r["models"][name]["metrics"][metric]["accuracy"] for r in results]
        rows.append([ARM_LABELS[name], *[f"{v:.3f}" for v in values], f"{sum(values) / len(values):.3f}",
                     f"{max(values) - min(values):.3f}"])
    lines = table(["model", *[f"seed {s}" for s in seeds], "mean", "spread"], rows)
    gaps = [r["models"]["t2mlr"]["metrics"][metric]["accuracy"] - r["models"]["transformer"]["metrics"][metric]["accuracy"]
            for r in results]
    mean_gap = round(sum(gaps) / len(gaps), 9) + 0.0  # no "-0.000" from rounding noise
    lines.append("| T²MLR − baseline | " + " | ".join(f"{g:+.3f}" for g in gaps) + f" | {mean_gap:+.3f} | |")
    return "\n".join(lines) + "\n"


def rescore_run(run_dir: Path) -> dict[str, Any]:
    """A run's results recomputed from its saved replies (predictions/<model>.jsonl) with every metric of its
    evaluation data; what results.json says about the models' accuracy is not read."""
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{run_dir} is not a retrofit run: it has no results.json")
    preset = json.loads(results_file.read_text(encoding="utf-8"))["preset"]
    eval_data = preset["eval_data"]
    if eval_data not in EVAL_METRICS:
        raise ValueError(f"{results_file}: unknown evaluation data {eval_data!r}")
    models, problems = {}, set()
    for name in MODELS:
        path = run_dir / "predictions" / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir}: the replies of {name!r} are missing ({path})")
        rows = read_jsonl(path)
        for i, row in enumerate(rows):
            if "reply" not in row or "answer" not in row:
                raise ValueError(f"{path} line {i + 1}: a saved reply needs 'reply' and 'answer'")
            row["scores"] = score_reply(eval_data, row["reply"], str(row["answer"]))
        models[name] = model_scores(rows, eval_data)
        problems.add(len(rows))
    if len(problems) != 1:
        raise ValueError(f"{run_dir}: the models were evaluated on different numbers of problems {sorted(problems)}")
    return {"run": str(run_dir), "preset": preset, "metrics": list(EVAL_METRICS[eval_data]),
            "eval_problems": problems.pop(), "models": models}


def write_summary(run_dirs: Sequence[Path], out: Path) -> dict[str, Any]:
    """Re-score several runs (seeds) and write summary.md (one table per metric) and summary.json."""
    runs = [rescore_run(Path(d)) for d in run_dirs]
    kinds = {r["preset"]["eval_data"] for r in runs}
    if len(kinds) != 1:
        raise ValueError(f"the runs were evaluated on different data {sorted(kinds)}: summarise them separately")
    metrics = runs[0]["metrics"]
    lines = ["# Retrofit experiment: every metric, re-scored from the saved replies", "",
             "Runs: " + ", ".join(f"`{r['run']}` (seed {r['preset']['seed']}, {r['eval_problems']} problems)" for r in runs)
             + ". Recomputed by `t2mlr experiment retrofit-summary` from each run's `predictions/*.jsonl`.", ""]
    for metric in metrics:
        lines += [f"## {METRIC_LABELS[metric]}", "", seeds_summary(runs, metric)]
    payload = {"metrics": metrics, "runs": [{k: r[k] for k in ("run", "eval_problems", "models")} | {"seed": r["preset"]["seed"]}
                                            for r in runs]}
    write_result(out, "summary", lines, payload)
    return payload
