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

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from t2mlr.training.distributed import DistEnv

__all__ = ["PretrainTask", "dry_run_arms", "run"]

ARMS = ("t2mlr_middle", "t2mlr_full", "transformer")


@dataclass(frozen=True)
class PretrainTask:
    """The task section of a pretraining config (`task:`)."""

    sources: tuple[str, ...] = ("python-docs",)  # offline corpus sources (t2mlr.corpus.offline)
    max_train_documents: int | None = None  # tokenize at most this many train documents (None: all)
    eval_batches: int = 8  # held-out batches of eval.batch_size rows for the final table


def config_name(preset: str) -> str:
    return f"experiments/pretrain_{preset}"


def describe(tree: dict[str, Any]) -> str:
    m, base, t = tree["model"], tree["model"]["base"], tree["train"]
    return (f"{base['num_hidden_layers']}-block Llama, hidden {base['hidden_size']}, {base['num_attention_heads']} heads "
            f"({base['num_key_value_heads']} key-value), MLP {base['intermediate_size']}, vocab {base['vocab_size']}; "
            f"{t['max_steps']} steps of {t['global_batch_size']} × {tree['data']['seq_len']} tokens, AdamW "
            f"{tuple(tree['optim']['betas'])}, wd {tree['optim']['weight_decay']:g}, lr {tree['optim']['lr']:g} cosine "
            f"to {tree['schedule']['min_lr_ratio']:g}×; Jacobi training d_forward {m['d_forward']}, d_backward "
            f"{m['d_backward']}")


# ---------------------------------------------------------------------------------------------- this data


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Path
    train_shards: Path
    validation_shards: Path
    summary: dict[str, Any]


def prepare_data(task: PretrainTask, vocab: int, data_dir: Path, corpus: Path | None = None,
                 workers: int = 1) -> PreparedData:
    """Corpus, tokenizer and token shards under `data_dir`; each step is skipped when its output is
    already there (a finished shard directory is left alone by `tokenize_corpus`)."""
    from t2mlr.corpus import prepare_offline_corpus, read_manifest, tokenize_corpus, train_bpe_tokenizer
    from t2mlr.corpus.offline import iter_texts
    from t2mlr.utils import load_tokenizer

    data_dir.mkdir(parents=True, exist_ok=True)
    text_dir = corpus if corpus is not None else data_dir / "english"
    if corpus is None and not (text_dir / "validation.jsonl").is_file():
        prepare_offline_corpus(text_dir, sources=task.sources)
    for split in ("train", "validation"):
        if not (text_dir / f"{split}.jsonl").is_file():
            raise ValueError(f"--corpus {text_dir}: no {split}.jsonl (write one with `t2mlr corpus prepare-offline DIR`)")
    tokenizer_dir = data_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_bpe_tokenizer(iter_texts(text_dir / "train.jsonl"), vocab, tokenizer_dir)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    shards = {}
    for split, limit in (("train", task.max_train_documents), ("validation", None)):
        shards[split] = data_dir / f"{split}_shards"
        tokenize_corpus(text_dir / f"{split}.jsonl", tokenizer, shards[split], workers=workers, max_documents=limit)
    summary = {split: {k: read_manifest(path)[k] for k in ("num_documents", "num_tokens")}
               for split, path in shards.items()}
    summary["corpus"] = str(text_dir)
    return PreparedData(tokenizer_dir, shards["train"], shards["validation"], summary)


def build_arms(tree: dict[str, Any], data: PreparedData) -> list[Any]:
    """T²MLR middle (the config), T²MLR full and the parameter-matched Transformer, on the prepared shards."""
    from t2mlr.training.arms import arm_from_tree, matched_arm
    from t2mlr.training.config import deep_merge

    shards = {"tokenizer": str(data.tokenizer)}
    filled = deep_merge(tree, {"data": {**shards, "path": str(data.train_shards)},
                               "eval": {"data": {**shards, "path": str(data.validation_shards)}}})
    m, layers = filled["model"], filled["model"]["base"]["num_hidden_layers"]
    return [arm_from_tree(filled, "t2mlr_middle", f"T²MLR({m['l_start']},{m['l_end']}) middle"),
            arm_from_tree(filled, "t2mlr_full", f"T²MLR(1,{layers}) full", ["model.l_start=1", f"model.l_end={layers}"]),
            matched_arm(filled, "transformer", "transformer")]


def dry_run_arms(tree: dict[str, Any], out: str | Path) -> tuple[list[Any], list[str]]:
    """The three arms `run` trains, on the paths `prepare_data` would fill, without preparing anything
    (`--dry-run`): the BPE is trained to model.base.vocab_size and rows are data.seq_len tokens, so every
    shape is the real run's."""
    data_dir = Path(out) / "data"
    data = PreparedData(data_dir / "tokenizer", data_dir / "train_shards", data_dir / "validation_shards", {})
    notes = ["data: the corpus, tokenizer and shards are not prepared in a dry run (the shapes do not depend on them: "
             "a BPE of model.base.vocab_size, packed rows of data.seq_len)"]
    return build_arms(tree, data), notes


# ---------------------------------------------------------------------------------------------- this score


def evaluate(task: PretrainTask, arms: list[Any], trained: dict[str, Any], env: DistEnv | None = None
             ) -> list[dict[str, Any]]:
    """One table row per (model, forward path): validation loss and perplexity on the same held-out rows, T²MLR
    on the exact path and on the Jacobi path at its training depth. Under torchrun (`env`) the batches
    are shared out over the ranks, every rank on its own device."""
    from t2mlr.analysis.common import describe_model, load_analysis_model, validation_loss
    from t2mlr.training.arms import validation_batches
    from t2mlr.training.distributed import current_env

    batches = validation_batches(arms[0].config, task.eval_batches)
    model_cfg = arms[0].config.model
    jacobi = {"recurrence": "jacobi", "d_forward": model_cfg.d_forward, "d_backward": model_cfg.d_backward}
    rows = []
    for arm in arms:
        device = current_env(arm.config.train.device).device
        model = load_analysis_model(trained[arm.name].model_dir, device=str(device))
        paths = [("plain", {})] if arm.name == "transformer" else [("exact", {"recurrence": "exact"}),
                                                                    (f"jacobi (d_forward {model_cfg.d_forward})", jacobi)]
        for path, call in paths:
            result = validation_loss(model, batches, env=env, **call)
            rows.append({"model": arm.name, "label": arm.label, "path": path,
                         "parameters": describe_model(model).parameters, **result})
    return rows


def loss_curves(run_dirs: dict[str, Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each run's training loss per step and periodic validation loss, from its metrics.jsonl."""
    from t2mlr.training.metrics import read_metrics

    curves = {}
    for name, run_dir in run_dirs.items():
        records = read_metrics(run_dir)
        curves[name] = {
            "train": [(int(r["step"]), float(r["loss"])) for r in records
                      if r.get("split") == "train" and isinstance(r.get("loss"), (int, float))],
            "eval": [(int(r["step"]), float(r["eval_loss"])) for r in records
                     if r.get("split") == "eval" and isinstance(r.get("eval_loss"), (int, float))],
        }
    return curves


# ---------------------------------------------------------------------------------------------- report


def results_markdown(preset: str, task: PretrainTask, tree: dict[str, Any], data: PreparedData,
                     rows: list[dict[str, Any]], seconds: dict[str, float], workers: int) -> list[str]:
    from t2mlr.analysis.report import table

    best = min(row["loss"] for row in rows)
    body = [[row["label"], row["path"], f"{row['parameters']:,}", f"{row['loss']:.4f}" + (" ←" if row["loss"] == best else ""),
             f"{row['ppl']:.2f}", f"{seconds[row['model']] / 60:.1f}"] for row in rows]
    return [
        f"# Pretraining on offline English text (`t2mlr experiment pretrain --preset {preset}`)",
        "",
        f"Corpus: {data.summary['corpus']} ({', '.join(task.sources)}); train "
        f"{data.summary['train']['num_documents']:,} documents / {data.summary['train']['num_tokens']:,} tokens, "
        f"held-out validation {data.summary['validation']['num_documents']:,} documents / "
        f"{data.summary['validation']['num_tokens']:,} tokens (split by document id, none shared).",
        f"Models: {describe(tree)}. The Transformer is the backbone widened to the smallest width with at "
        "least T²MLR's parameters.",
        f"Validation: the first {task.eval_batches} batches of {tree['eval']['batch_size']} rows of "
        f"{tree['data']['seq_len']} tokens of the held-out shards, the same rows for every model; loss in nats/token.",
        f"Scheduling: {workers} worker process(es) side by side.",
        "",
        *table(["model", "path", "parameters", "validation loss", "perplexity", "train minutes"], body),
        "",
        "Curves: loss_curves.png (training loss, and the periodic validation loss on 2 batches).",
    ]


def run(preset: str, task: PretrainTask, tree: dict[str, Any], out: str | Path, *, corpus: str | Path | None = None,
        workers: int | None = None, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """The whole pipeline (see the module docstring); returns what results.json holds. Under torchrun rank 0
    prepares the data and writes the results, every arm trains over every rank and the validation batches are
    shared out (docs/scale.md)."""
    from t2mlr.analysis.figures import plot_loss_curves
    from t2mlr.analysis.report import write_result
    from t2mlr.training.arms import claim_run_dirs, resolve_workers, train_arms
    from t2mlr.training.distributed import computed_by_main, current_env
    from t2mlr.utils import cpu_arithmetic

    out = Path(out)
    env = current_env(tree["train"].get("device", "cpu"))
    started = time.perf_counter()

    def prepare() -> PreparedData:
        claim_run_dirs(out, ARMS, resume=resume, overwrite=overwrite)
        return prepare_data(task, int(tree["model"]["base"]["vocab_size"]), out / "data",
                            Path(corpus) if corpus is not None else None)

    data = computed_by_main(prepare, env)
    arms = build_arms(tree, data)
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
        write_result(out, "results", results_markdown(preset, task, tree, data, rows, seconds, count), payload)
    return payload
