"""`t2mlr experiment retrofit`: the paper's retrofit experiment, end to end.

    t2mlr experiment retrofit --preset cpu --out runs/retrofit      # SmolLM2-135M-Instruct, ~15 min/seed, 1 core
    t2mlr experiment retrofit --preset paper --out runs/retrofit \\
        --train-path OpenMathReasoning.parquet --eval-path gsm8k_test.jsonl   # GPU, the paper's setting
    t2mlr experiment retrofit --preset tiny --out /tmp/retrofit     # pipeline check only

Steps: (1) load the pretrained model once (GGUF dequantised) and save it with its tokenizer under
OUT/base, so both arms start from the very same weights; (2) write the finetuning and held-out
evaluation records under OUT/data; (3) evaluate the pretrained model before finetuning; (4) finetune
the unchanged model (`transformer`) and its T²MLR(l_start, l_end) retrofit (`t2mlr`) with the project
trainer, the same rows in the same order, steps, optimiser and seed, prompts masked from the loss; (5)
evaluate both by batched greedy generation (exact path for T²MLR). Writes OUT/results.md, OUT/results.json,
OUT/predictions/<model>.jsonl, OUT/retrofit.png (accuracy and training loss per arm) and one training
run directory per arm (OUT/runs/<arm>, final/ loads with `t2mlr generate`).

Scoring (`t2mlr.tasks.scoring`): GSM-format answers (the generated problems, GSM8K) by both of
lm-evaluation-harness's GSM8K metrics, strict-match (the answer after "####" or "The answer is"; the headline
number) and flexible-extract (the reply's last number, which also credits a reply cut off before its answer
when the last number it copied happens to be the answer); MATH-500 by the boxed answer after MATH's
normalisation (`--eval math500 --eval-path FILE`).

    t2mlr experiment retrofit-summary runs/retrofit/seed0 runs/retrofit/seed1 --out runs/retrofit

re-scores the saved replies of several runs (seeds) with every metric and writes one table per metric
(summary.md, summary.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ARMS", "EVAL_METRICS", "add_experiment", "evaluate_greedy", "rescore_run", "run_experiment",
           "score_reply", "seeds_summary"]

ARMS = ("transformer", "t2mlr")
MODELS = ("base", *ARMS)
# The metrics of each kind of evaluation data, the headline (in results.md's first column and the figure) first.
EVAL_METRICS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("strict_match", "flexible_extract"),
    "gsm8k": ("strict_match", "flexible_extract"),
    "math500": ("math_equiv",),
}
METRIC_LABELS = {"strict_match": "strict-match (####, The answer is)", "flexible_extract": "flexible-extract (last number)",
                 "math_equiv": "boxed answer, MATH normalisation"}
ARM_LABELS = {"base": "pretrained, not finetuned", "transformer": "finetuned base (baseline)",
              "t2mlr": "finetuned T²MLR retrofit"}
DATA_FACTORY = "t2mlr.experiments.retrofit_data:prompt_target_dataset"


# ------------------------------------------------------------------------------------------ preparation
def prepare_base(preset: Any, out: Path) -> tuple[Path, float]:
    """The pretrained model and tokenizer saved once as a Hugging Face directory (reused when present);
    returns it and the seconds the load took (0 when reused)."""
    from t2mlr.model.pretrained import load_pretrained_base

    base_dir = out / "base"
    if (base_dir / "config.json").is_file():
        return base_dir, 0.0
    start = time.perf_counter()
    model, tokenizer = load_pretrained_base(preset.source, gguf_file=preset.gguf_file)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    staging = out / "base.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(base_dir)
    return base_dir, time.perf_counter() - start


def build_records(preset: Any) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The finetuning and evaluation records of the preset's data sources."""
    from t2mlr.experiments import retrofit_data as data

    if preset.train_data == "arithmetic":
        train = data.arithmetic_records(preset.train_problems, "train", preset.seed, preset.arithmetic)
    else:
        train = data.openmathreasoning_records(preset.train_path, preset.train_problems)
    if preset.eval_data == "arithmetic":
        evaluation = data.arithmetic_records(preset.eval_problems, "eval", preset.seed, preset.arithmetic)
    elif preset.eval_data == "math500":
        evaluation = data.math500_records(preset.eval_path, preset.eval_problems)
    else:
        evaluation = data.gsm8k_records(preset.eval_path, preset.eval_problems)
    if not evaluation:
        raise ValueError(f"no evaluation problems: {preset.eval_path or preset.eval_data} has no rows")
    return train, evaluation


def arm_config(preset: Any, arm: str, base_dir: Path, train_file: Path, pad_token_id: int, device: str) -> Any:
    """The trainer config of one arm; the arms differ only in `model`."""
    from t2mlr.training.config import config_from_tree

    model: dict[str, Any] = {"arch": arm, "pretrained": str(base_dir)}
    if arm == "t2mlr":
        model.update(
            l_start=preset.l_start, l_end=preset.l_end, d_forward=preset.d_forward, d_backward=preset.d_backward,
            train_recurrence="jacobi", eval_recurrence="exact",
            recurrence_mask_policy="mask" if preset.mask_prompt_recurrence else "all",
        )
    tree = {
        "model": model,
        "data": {
            "source": "factory", "factory": DATA_FACTORY, "seq_len": preset.max_length, "pad_token_id": pad_token_id,
            "seed": preset.seed,
            "kwargs": {"path": str(train_file), "tokenizer": str(base_dir), "max_length": preset.max_length,
                       "mask_prompt_recurrence": preset.mask_prompt_recurrence},
        },
        "optim": {"lr": preset.lr, "betas": list(preset.betas), "weight_decay": preset.weight_decay,
                  "fusion_lr_mult": preset.fusion_lr_mult},
        "schedule": {"kind": "cosine", "warmup_steps": preset.warmup_steps},
        "train": {"max_steps": preset.steps, "global_batch_size": preset.batch_size,
                  "micro_batch_size": preset.micro_batch_size, "seed": preset.seed, "device": device,
                  "precision": preset.precision},
        "checkpoint": {"every": 0, "keep_last": 1, "save_final": True},
        "logging": {"progress_label": f"finetune {arm}"},
    }
    return config_from_tree(tree)


# ------------------------------------------------------------------------------------------ evaluation
def score_reply(eval_data: str, reply: str, answer: str) -> dict[str, dict[str, Any]]:
    """Every metric of the evaluation data on one reply: {metric: {"extracted", "correct"}}."""
    from t2mlr.tasks import scoring

    readers = {"strict_match": (scoring.gsm8k_strict_extract, scoring.gsm8k_match),
               "flexible_extract": (scoring.gsm8k_flexible_extract, scoring.gsm8k_match),
               "math_equiv": (scoring.extract_math_answer, scoring.math_match)}
    scores = {}
    for metric in EVAL_METRICS[eval_data]:
        extract, match = readers[metric]
        extracted = extract(reply)
        scores[metric] = {"extracted": extracted, "correct": match(extracted, answer)}
    return scores


def evaluate_greedy(
    model: Any, tokenizer: Any, records: Sequence[dict[str, str]], max_new_tokens: int, batch_size: int,
    label: str = "eval", eval_data: str = "arithmetic",
) -> list[dict[str, Any]]:
    """Greedy replies to every record's prompt (left-padded batches), scored by every metric of `eval_data`;
    `correct` is the headline metric's verdict.

    A T²MLR model with recurrence_mask_policy="mask" gets the prompt masked from the recurrence, as in
    training; its prompt runs on the exact path."""
    import torch
    from tqdm.auto import tqdm

    from t2mlr.model import is_t2mlr

    tokenizer.padding_side = "left"
    masked = is_t2mlr(model) and model.config.recurrence_mask_policy == "mask"
    model.eval()
    predictions: list[dict[str, Any]] = []
    for start in tqdm(range(0, len(records), batch_size), desc=f"evaluate {label}", leave=False):
        chunk = records[start : start + batch_size]
        batch = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        extra = {"recurrence_mask": torch.zeros_like(batch["input_ids"], dtype=torch.bool)} if masked else {}
        with torch.no_grad():
            out = model.generate(**batch, **extra, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        for record, row in zip(chunk, out[:, batch["input_ids"].shape[1] :].tolist()):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            reply = tokenizer.decode(row, skip_special_tokens=True)
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


def _write_predictions(out: Path, name: str, predictions: Sequence[dict[str, Any]]) -> None:
    from t2mlr.tasks.jsonl import write_jsonl

    write_jsonl(predictions, out / "predictions" / f"{name}.jsonl")


def _train_arm(preset: Any, arm: str, base_dir: Path, train_file: Path, pad_id: int, device: str, out: Path
               ) -> tuple[Any, dict[str, Any]]:
    """Finetune one arm with the project trainer; its model (eval mode) and what the run cost."""
    from t2mlr.training.trainer import Trainer

    cfg = arm_config(preset, arm, base_dir, train_file, pad_id, device)
    run_dir = out / "runs" / arm
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = Trainer(cfg, run_dir)
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    info = {"train_seconds": step_seconds(run_dir / "metrics.jsonl"), "train_and_save_seconds": seconds,
            "tokens_seen": trainer.tokens_seen, "steps": result.step,
            "losses": result.losses, "parameters": sum(p.numel() for p in trainer.model.parameters()),
            "run_dir": str(run_dir)}
    return trainer.model.eval(), info


def step_seconds(metrics_file: Path) -> float:
    """Seconds the optimizer steps took (checkpoint writing left out), from the trainer's per-step
    records: each step's tokens over its tokens/s."""
    seconds, seen = 0.0, 0
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("split") == "train":
            seconds += (record["tokens_seen"] - seen) / record["tokens_per_s"]
            seen = record["tokens_seen"]
    return seconds


def run_experiment(preset: Any, out: Path, device: str = "auto", overwrite: bool = False) -> dict[str, Any]:
    """Run the whole experiment into `out` and return what results.json holds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t2mlr.tasks.jsonl import write_jsonl

    preset.validate()
    train_records, eval_records = build_records(preset)  # bad data fails before any weight is loaded
    _check_out(out, overwrite)
    started = time.perf_counter()
    base_dir, load_seconds = prepare_base(preset, out)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    train_file = out / "data" / "train.jsonl"
    write_jsonl(train_records, train_file)
    write_jsonl(eval_records, out / "data" / "eval.jsonl")

    models: dict[str, dict[str, Any]] = {}
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    predictions = evaluate_greedy(base, tokenizer, eval_records, preset.max_new_tokens, preset.eval_batch_size, "base",
                                  preset.eval_data)
    del base
    _write_predictions(out, "base", predictions)
    models["base"] = model_scores(predictions, preset.eval_data)
    for arm in ARMS:
        model, info = _train_arm(preset, arm, base_dir, train_file, tokenizer.pad_token_id, device, out)
        eval_start = time.perf_counter()
        predictions = evaluate_greedy(model, tokenizer, eval_records, preset.max_new_tokens, preset.eval_batch_size, arm,
                                      preset.eval_data)
        del model
        _write_predictions(out, arm, predictions)
        models[arm] = {**model_scores(predictions, preset.eval_data), "eval_seconds": time.perf_counter() - eval_start,
                       **info}
    results = {
        "preset": {**dataclasses.asdict(preset), "arithmetic": dataclasses.asdict(preset.arithmetic)},
        "metrics": list(EVAL_METRICS[preset.eval_data]),
        "eval_problems": len(eval_records),
        "train_rows": len(train_records),
        "base_load_seconds": load_seconds,
        "total_seconds": time.perf_counter() - started,
        "models": models,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "results.md").write_text(results_markdown(results), encoding="utf-8")
    plot_results(results, out / "retrofit.png")
    return results


# ------------------------------------------------------------------------------------------ reporting
def _metric_cell(m: dict[str, Any], metric: str, problems: int) -> str:
    value = m["metrics"][metric]
    return f"{value['accuracy']:.3f} ({value['solved']}/{problems})"


def results_markdown(results: dict[str, Any]) -> str:
    p, models, metrics = results["preset"], results["models"], results["metrics"]
    lines = [
        f"# Retrofit experiment ({p['name']} preset, seed {p['seed']})",
        "",
        (
            f"T²MLR({p['l_start']},{p['l_end']}) retrofitted into `{p['source']}`; both arms finetuned with the same "
            f"{results['train_rows']} rows, {p['steps']} steps of batch {p['batch_size']}, AdamW lr {p['lr']} "
            f"(betas {tuple(p['betas'])}, weight decay {p['weight_decay']}, cosine, warmup {p['warmup_steps']}), "
            f"seed {p['seed']}; prompts masked from the loss{', and from the recurrence' if p['mask_prompt_recurrence'] else ''}. "
            f"T²MLR trains on the Jacobi path (d_forward {p['d_forward']}, d_backward {p['d_backward']}) and answers on "
            f"the exact path. Accuracy of greedy replies on {results['eval_problems']} held-out problems "
            f"({p['eval_data']}), by each metric (`t2mlr.tasks.scoring`); the first is the headline."
        ),
        "",
        "| model | " + " | ".join(METRIC_LABELS[m] for m in metrics)
        + " | training time (s, optimizer steps) | tokens seen | final training loss |",
        "|---|" + "---|" * (len(metrics) + 3),
    ]
    for name in MODELS:
        m = models[name]
        loss = f"{sum(m['losses'][-5:]) / len(m['losses'][-5:]):.4f}" if m.get("losses") else "–"
        cells = " | ".join(_metric_cell(m, metric, results["eval_problems"]) for metric in metrics)
        lines.append(f"| {ARM_LABELS[name]} | {cells} | {m.get('train_seconds', 0):.0f} | {m.get('tokens_seen', 0)} | {loss} |")
    lines += ["", f"Whole run: {results['total_seconds'] / 60:.1f} min. Final loss: mean of the last 5 steps.", ""]
    return "\n".join(lines)


def seeds_summary(results: Sequence[dict[str, Any]], metric: str) -> str:
    """Markdown table of one metric over several seeds' results side by side, with each model's mean and the
    spread (max - min) across seeds, and the T²MLR-minus-baseline gap per seed."""
    seeds = [r["preset"]["seed"] for r in results]
    lines = ["| model | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | spread |",
             "|---|" + "---|" * (len(seeds) + 2)]
    for name in MODELS:
        values = [r["models"][name]["metrics"][metric]["accuracy"] for r in results]
        cells = " | ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {ARM_LABELS[name]} | {cells} | {sum(values) / len(values):.3f} | {max(values) - min(values):.3f} |")
    gaps = [r["models"]["t2mlr"]["metrics"][metric]["accuracy"] - r["models"]["transformer"]["metrics"][metric]["accuracy"]
            for r in results]
    mean_gap = round(sum(gaps) / len(gaps), 9) + 0.0  # no "-0.000" from rounding noise
    lines.append("| T²MLR − baseline | " + " | ".join(f"{g:+.3f}" for g in gaps) + f" | {mean_gap:+.3f} | |")
    return "\n".join(lines) + "\n"


def rescore_run(run_dir: Path) -> dict[str, Any]:
    """A run's results recomputed from its saved replies (predictions/<model>.jsonl) with every metric of its
    evaluation data; what results.json says about the models' accuracy is not read."""
    from t2mlr.tasks.jsonl import read_jsonl

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
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("\n".join(lines), encoding="utf-8")
    payload = {"metrics": metrics, "runs": [{k: r[k] for k in ("run", "eval_problems", "models")} | {"seed": r["preset"]["seed"]}
                                            for r in runs]}
    (out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return payload


def plot_results(results: dict[str, Any], path: Path) -> None:
    """Accuracy per model (left) and the training loss per finetuned arm (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["base", *ARMS]
    left.bar([ARM_LABELS[n].replace(" ", "\n", 1) for n in names], [models[n]["accuracy"] for n in names],
             color=["grey", "tab:blue", "tab:orange"])
    left.set_ylabel(f"accuracy ({METRIC_LABELS[results['metrics'][0]]})")
    left.set_title("held-out accuracy")
    for arm, colour in zip(ARMS, ("tab:blue", "tab:orange")):
        losses = models[arm]["losses"]
        right.plot(range(1, len(losses) + 1), losses, label=ARM_LABELS[arm], color=colour)
    right.set_xlabel("step")
    right.set_ylabel("training loss (reply tokens)")
    right.set_title("finetuning loss")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ command
def run_command(args: argparse.Namespace) -> int:
    import torch

    from t2mlr.training.exit_codes import run_with_exit_codes

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    code, _ = run_with_exit_codes("t2mlr experiment retrofit", lambda: _run_retrofit(args))
    if code == 0:
        print((args.out / "results.md").read_text(encoding="utf-8"))
    return code


def _run_retrofit(args: argparse.Namespace) -> None:
    from t2mlr.experiments.retrofit_presets import get_preset

    preset = get_preset(args.preset)
    overrides = {name: getattr(args, name) for name in ("seed", "steps", "source", "gguf_file", "train_path",
                                                         "eval_path") if getattr(args, name) is not None}
    if args.eval is not None:
        overrides["eval_data"] = args.eval
    if args.mask_prompt_recurrence:
        overrides["mask_prompt_recurrence"] = True
    run_experiment(dataclasses.replace(preset, **overrides), args.out, device=args.device, overwrite=args.overwrite)


def add_experiment(sub: Any) -> None:
    p = sub.add_parser("retrofit", help="retrofit T²MLR into a pretrained model, finetune it and the base, compare",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("cpu", "paper", "tiny"), default="cpu", help="settings (default: cpu)")
    p.add_argument("--out", type=Path, default=Path("runs/retrofit"), help="output directory (default: runs/retrofit)")
    p.add_argument("--seed", type=int, default=None, help="seed of the data and of training (default: 0)")
    p.add_argument("--steps", type=int, default=None, help="override the finetuning steps of both arms")
    p.add_argument("--source", default=None, help="override the pretrained model (hub id, directory, .gguf, shortcut)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --source")
    p.add_argument("--train-path", default=None, help="OpenMathReasoning jsonl/parquet (paper preset)")
    p.add_argument("--eval", choices=EVAL_METRICS, default=None,
                   help="evaluation data: arithmetic (generated), gsm8k or math500 (a local --eval-path file); "
                        "default: the preset's (cpu: arithmetic, paper: gsm8k)")
    p.add_argument("--eval-path", default=None,
                   help="GSM8K test or MATH-500 jsonl/parquet (the paper preset evaluates every row)")
    p.add_argument("--mask-prompt-recurrence", action="store_true",
                   help="the prompt's tokens skip the fusion (they still write the recurrent state)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="training device (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--overwrite", action="store_true", help="replace the results and runs in a non-empty --out")
    p.set_defaults(func=run_command)

    summary = sub.add_parser("retrofit-summary", help="re-score retrofit runs (seeds) with every metric, one table each")
    summary.add_argument("runs", nargs="+", type=Path, help="output directories of `t2mlr experiment retrofit`")
    summary.add_argument("--out", type=Path, required=True, help="where summary.md and summary.json go")
    summary.set_defaults(func=run_summary_command)


def run_summary_command(args: argparse.Namespace) -> int:
    try:
        write_summary(args.runs, args.out)
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as err:
        print(f"t2mlr experiment retrofit-summary: {err}", file=sys.stderr)
        return 2
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    return 0
