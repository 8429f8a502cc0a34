"""`t2mlr experiment pretrain`: the pretraining pipeline of the paper's 135M comparison, end to end, at a
scale a CPU finishes, on real English text that needs no hub.

These configs: `configs/experiments/pretrain_{cpu,tiny}.yaml`, the T²MLR-middle arm's trainer config plus the
task section `PretrainTask` (the corpus sources and the size of the final evaluation).

Steps, each an ordinary part of the library:
1. corpus: the Python documentation sources of Debian's python3.11-doc package (English prose; the
   `cpu` preset) or also the GCIDE dictionary (`apt-get install python3.11-doc dict-gcide`), split into
   train and held-out validation documents by a hash of their ids (`t2mlr.corpus.prepare_offline_corpus`),
   a byte-level BPE trained on the train split, and both splits tokenized into token shards
   (`tokenize_corpus`, what `t2mlr data tokenize` runs). `--corpus DIR` reuses a prepared corpus
   (train.jsonl and validation.jsonl from `t2mlr corpus prepare-offline`).
2. training, with the project trainer, of three models on the same rows: T²MLR with a middle block,
   T²MLR over every block (full recurrence) and the parameter-matched Transformer (the backbone widened to
   the smallest width with at least T²MLR's parameters): `t2mlr.training.arms`, side by side on a CPU, one
   worker process each up to the torch threads (`--workers`).
3. evaluation of the validation loss on the held-out documents: T²MLR on the exact (token-by-token)
   recurrence and on the Jacobi path at the training depth, the Transformer on its only path.

Writes OUT/results.md, OUT/results.json, OUT/loss_curves.png, the data under OUT/data and one run
directory per model. `--resume` continues interrupted runs; exit codes: 0 done, 1 training stopped (a
non-finite loss), 2 bad input or an existing run directory.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from t2mlr.analysis.common import describe_model, load_analysis_model, validation_loss
from t2mlr.analysis.figures import plot_loss_curves
from t2mlr.analysis.report import table, write_result
from t2mlr.corpus import prepare_offline_corpus, read_manifest, tokenize_corpus, train_bpe_tokenizer
from t2mlr.corpus.offline import ENGLISH_SOURCES, iter_texts
from t2mlr.experiments.sections import PRETRAIN_ARMS as ARMS
from t2mlr.experiments.sections import PretrainTask
from t2mlr.training.arms import (
    arm_from_tree,
    claim_run_dirs,
    matched_arm,
    resolve_workers,
    train_arms,
    validation_batches,
)
from t2mlr.training.config import deep_merge
from t2mlr.training.distributed import DistEnv, computed_by_main, current_env
from t2mlr.training.metrics import read_metrics, values_at_steps
from t2mlr.utils import cpu_arithmetic, load_tokenizer

__all__ = ["PretrainTask", "dry_run_arms", "run"]



def describe(tree: dict[str, Any]) -> str:
    m, base, t, schedule = tree["model"], tree["model"]["base"], tree["train"], tree["schedule"]
    length = f"{t['max_steps']} steps" if t.get("max_seconds") is None else f"{t['max_seconds']:g} s of training steps"
    lr = (f"lr {tree['optim']['lr']:g} constant after {schedule.get('warmup_steps', 0)} warm-up steps"
          if schedule.get("kind") == "constant" else
          f"lr {tree['optim']['lr']:g} {schedule.get('kind', 'cosine')} to {schedule['min_lr_ratio']:g}×")
    return (f"{base['num_hidden_layers']}-block Llama, hidden {base['hidden_size']}, {base['num_attention_heads']} heads "
            f"({base['num_key_value_heads']} key-value), MLP {base['intermediate_size']}, vocab {base['vocab_size']}; "
            f"{length} of {t['global_batch_size']} × {tree['data']['seq_len']} tokens, AdamW "
            f"{tuple(tree['optim']['betas'])}, wd {tree['optim']['weight_decay']:g}, {lr}; Jacobi training d_forward "
            f"{m['d_forward']}, d_backward {m['d_backward']}")


# ---------------------------------------------------------------------------------------------- this data


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Path
    train_shards: Path
    validation_shards: Path
    summary: dict[str, Any]


def prepare_data(task: PretrainTask, vocab: int, data_dir: Path, corpus: Path | None = None) -> PreparedData:
    """Corpus, tokenizer and token shards under `data_dir`; each step is skipped when its output is
    already there (a finished shard directory is left alone by `tokenize_corpus`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    text_dir = corpus if corpus is not None else data_dir / "english"
    if corpus is None and not (text_dir / "validation.jsonl").is_file():
        roots = {} if task.python_sources is None else {"python_sources_root": task.python_sources}
        prepare_offline_corpus(text_dir, sources=task.sources, **roots)
    for split in ("train", "validation"):
        if not (text_dir / f"{split}.jsonl").is_file():
            raise ValueError(f"--corpus {text_dir}: no {split}.jsonl (write one with `t2mlr corpus prepare-offline DIR`)")
    tokenizer_dir = data_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        texts = itertools.islice(iter_texts(text_dir / "train.jsonl"), task.tokenizer_documents)
        train_bpe_tokenizer(texts, vocab, tokenizer_dir)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    shards = {}
    for split, limit in (("train", task.max_train_documents), ("validation", None)):
        shards[split] = data_dir / f"{split}_shards"
        tokenize_corpus(text_dir / f"{split}.jsonl", tokenizer, shards[split], workers=task.tokenize_workers,
                        max_documents=limit)
    summary = {split: {k: read_manifest(path)[k] for k in ("num_documents", "num_tokens")}
               for split, path in shards.items()}
    summary["corpus"] = str(text_dir)
    return PreparedData(tokenizer_dir, shards["train"], shards["validation"], summary)


def build_arms(tree: dict[str, Any], data: PreparedData, names: tuple[str, ...] = ARMS) -> list[Any]:
    """Of T²MLR middle (the config), T²MLR full and the parameter-matched Transformer, the `names`, on the prepared
    shards."""
    shards = {"tokenizer": str(data.tokenizer)}
    filled = deep_merge(tree, {"data": {**shards, "path": str(data.train_shards)},
                               "eval": {"data": {**shards, "path": str(data.validation_shards)}}})
    m, layers = filled["model"], filled["model"]["base"]["num_hidden_layers"]
    arms = [arm_from_tree(filled, "t2mlr_middle", f"T²MLR({m['l_start']},{m['l_end']}) middle"),
            arm_from_tree(filled, "t2mlr_full", f"T²MLR(1,{layers}) full", ["model.l_start=1", f"model.l_end={layers}"]),
            matched_arm(filled, "transformer", "transformer")]
    return [arm for arm in arms if arm.name in names]


def dry_run_arms(tree: dict[str, Any], out: str | Path, names: tuple[str, ...] = ARMS) -> tuple[list[Any], list[str]]:
    """The arms `run` trains, on the paths `prepare_data` would fill, without preparing anything
    (`--dry-run`): the BPE is trained to model.base.vocab_size and rows are data.seq_len tokens, so every
    shape is the real run's."""
    data_dir = Path(out) / "data"
    data = PreparedData(data_dir / "tokenizer", data_dir / "train_shards", data_dir / "validation_shards", {})
    notes = ["data: the corpus, tokenizer and shards are not prepared in a dry run (the shapes do not depend on them: "
             "a BPE of model.base.vocab_size, packed rows of data.seq_len)"]
    return build_arms(tree, data, names), notes


# ---------------------------------------------------------------------------------------------- this score


def evaluate(task: PretrainTask, arms: list[Any], trained: dict[str, Any], env: DistEnv | None = None
             ) -> list[dict[str, Any]]:
    """One table row per (model, forward path): validation loss and perplexity on the same held-out rows, T²MLR
    on the Jacobi path at its training depth and on the exact path (on the first task.exact_eval_batches of
    them: it is sequential in the tokens). Under torchrun (`env`) the batches are shared out over the ranks,
    every rank on its own device."""
    batches = validation_batches(arms[0].config, task.eval_batches)
    model_cfg = arms[0].config.model
    jacobi = {"recurrence": "jacobi", "d_forward": model_cfg.d_forward, "d_backward": model_cfg.d_backward}
    exact_batches = batches[:task.exact_eval_batches] if task.exact_eval_batches is not None else batches
    rows = []
    for arm in arms:
        device = current_env(arm.config.train.device).device
        model = load_analysis_model(trained[arm.name].model_dir, device=str(device))
        paths = [("plain", {}, batches)] if arm.name == "transformer" else [
            ("exact", {"recurrence": "exact"}, exact_batches),
            (f"jacobi (d_forward {model_cfg.d_forward})", jacobi, batches)]
        for path, call, rows_scored in paths:
            if not rows_scored:
                continue
            result = validation_loss(model, rows_scored, env=env, **call)
            rows.append({"model": arm.name, "label": arm.label, "path": path, "batches": len(rows_scored),
                         "parameters": describe_model(model).parameters, **result})
    return rows


def loss_curves(run_dirs: dict[str, Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each run's training loss per step and periodic validation loss, and the tokens trained on and the seconds
    of training steps up to each logged step, from its metrics.jsonl."""
    curves = {}
    for name, run_dir in run_dirs.items():
        train = [r for r in read_metrics(run_dir) if r.get("split") == "train" and isinstance(r.get("loss"), (int, float))]
        curves[name] = {
            "train": [(int(r["step"]), float(r["loss"])) for r in train],
            "eval": [(int(r["step"]), float(r["eval_loss"])) for r in read_metrics(run_dir)
                     if r.get("split") == "eval" and isinstance(r.get("eval_loss"), (int, float))],
            "tokens": [(int(r["step"]), int(r["tokens_seen"])) for r in train],
            "step_seconds": [(int(r["step"]), float(r["step_seconds"])) for r in train],
        }
    return curves


def validation_loss_at_tokens(curve: dict[str, list], tokens: int) -> tuple[int, float] | None:
    """The last periodic validation loss of a run taken after at most `tokens` training tokens, and those tokens."""
    seen = values_at_steps(curve["tokens"], [step for step, _ in curve["eval"]])
    points = [(int(t), loss) for t, (_, loss) in zip(seen, curve["eval"]) if t <= tokens]
    return points[-1] if points else None


# ---------------------------------------------------------------------------------------------- report


def same_tokens_lines(curves: dict[str, dict[str, list]], labels: dict[str, str]) -> list[str]:
    """With a time budget the arms train on different numbers of tokens: each arm's validation loss at the tokens
    the slowest arm reached (its periodic evaluation there), so the comparison holds at equal data too."""
    trained = {name: curve["tokens"][-1][1] for name, curve in curves.items() if curve["tokens"]}
    if len(set(trained.values())) < 2:
        return []
    fewest = min(trained.values())
    lines = [f"Equal tokens: every arm's periodic validation loss after at most {fewest:,} tokens (what the arm "
             "with the fewest reached in the budget):", ""]
    for name, curve in curves.items():
        point = validation_loss_at_tokens(curve, fewest)
        lines.append(f"- {labels[name]}: " + ("no evaluation that early" if point is None else
                                             f"{point[1]:.4f} after {point[0]:,} tokens"))
    return lines + [""]


def results_markdown(preset: str, task: PretrainTask, tree: dict[str, Any], data: PreparedData,
                     rows: list[dict[str, Any]], seconds: dict[str, float], workers: int,
                     curves: dict[str, dict[str, list]]) -> list[str]:
    best = min(row["loss"] for row in rows)
    tokens = {name: curve["tokens"][-1][1] if curve["tokens"] else 0 for name, curve in curves.items()}
    body = [[row["label"], row["path"], f"{row['parameters']:,}", f"{row['loss']:.4f}" + (" ←" if row["loss"] == best else ""),
             f"{row['ppl']:.2f}", f"{tokens[row['model']]:,}", f"{seconds[row['model']] / 60:.1f}"] for row in rows]
    labels = {row["model"]: row["label"] for row in rows}
    exact_note = ("" if task.exact_eval_batches is None else
                  f" The exact path is scored on the first {task.exact_eval_batches} of them (it is sequential in the tokens).")
    return [
        f"# Pretraining on offline {'English ' if set(task.sources) <= set(ENGLISH_SOURCES) else ''}text "
        f"(`t2mlr experiment pretrain --preset {preset}`)",
        "",
        f"Corpus: {data.summary['corpus']} ({', '.join(task.sources)}); train "
        f"{data.summary['train']['num_documents']:,} documents / {data.summary['train']['num_tokens']:,} tokens, "
        f"held-out validation {data.summary['validation']['num_documents']:,} documents / "
        f"{data.summary['validation']['num_tokens']:,} tokens (split by document id, none shared).",
        f"Models: {describe(tree)}. The Transformer is the backbone widened to the smallest width with at "
        "least T²MLR's parameters.",
        f"Validation: the first {task.eval_batches} batches of {tree['eval']['batch_size']} rows of "
        f"{tree['data']['seq_len']} tokens of the held-out shards, the same rows for every model; loss in nats/token."
        + exact_note,
        f"Scheduling: {workers} worker process(es) side by side.",
        "",
        *table(["model", "path", "parameters", "validation loss", "perplexity", "tokens trained", "train minutes"], body),
        "",
        *same_tokens_lines(curves, labels),
        "Curves: loss_curves.png (training loss per token, and the periodic validation loss per token and per second "
        "of training steps).",
    ]


def run(preset: str, task: PretrainTask, tree: dict[str, Any], out: str | Path, *, corpus: str | Path | None = None,
        workers: int | None = None, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """The whole pipeline (see the module docstring); returns what results.json holds. Under torchrun rank 0
    prepares the data and writes the results, every arm trains over every rank and the validation batches are
    shared out (docs/scale.md)."""
    out = Path(out)
    env = current_env(tree["train"].get("device", "cpu"))
    started = time.perf_counter()

    def prepare() -> PreparedData:
        claim_run_dirs(out, task.arms, resume=resume, overwrite=overwrite)
        return prepare_data(task, int(tree["model"]["base"]["vocab_size"]), out / "data",
                            Path(corpus) if corpus is not None else None)

    data = computed_by_main(prepare, env)
    arms = build_arms(tree, data, task.arms)
    count = resolve_workers(workers, len(arms), env.device)
    trained, _ = train_arms(arms, out, resume=resume, workers=count)
    seconds = {name: arm.seconds for name, arm in trained.items()}
    rows = evaluate(task, arms, trained, env)
    curves = loss_curves({arm.name: trained[arm.name].run_dir for arm in arms})
    payload = {"preset": {"name": preset, "steps": int(tree["train"]["max_steps"]), **asdict(task),
                          "description": describe(tree)}, "data": data.summary,
               "results": rows, "train_seconds": seconds, "workers": count, **cpu_arithmetic(),
               "wall_seconds": time.perf_counter() - started, "curves": curves}
    if env.is_main:
        plot_loss_curves(curves, {arm.name: arm.label for arm in arms}, out / "loss_curves.png")
        write_result(out, "results", results_markdown(preset, task, tree, data, rows, seconds, count, curves), payload)
    return payload
