"""`t2mlr experiment pretrain`: the pretraining pipeline of the paper's 135M comparison, end to end, at a
scale a CPU finishes, on real English text that needs no hub.

    t2mlr experiment pretrain --preset cpu --out runs/pretrain     # ~10 min of CPU time (results/pretrain_cpu)
    t2mlr experiment pretrain --preset tiny --out /tmp/pretrain    # seconds: pipeline check only

Steps, each an ordinary part of the library:
1. corpus: the Python documentation sources of Debian's python3.11-doc package (English prose; the
   `cpu` preset) or also the GCIDE dictionary (`apt-get install python3.11-doc dict-gcide`), split into
   train and held-out validation documents by a hash of their ids (`t2mlr.corpus.prepare_offline_corpus`),
   a byte-level BPE trained on the train split, and both splits tokenized into token shards
   (`tokenize_corpus`, what `t2mlr data tokenize` runs). `--corpus DIR` reuses a prepared corpus
   (train.jsonl and validation.jsonl from `t2mlr corpus prepare-offline`).
2. training, with the project trainer, of three models on the same rows: T²MLR with a middle block,
   T²MLR over every block (full recurrence) and the parameter-matched Transformer (the backbone widened to
   the smallest width with at least T²MLR's parameters). On a CPU they train side by side, one worker
   process each up to the torch threads (`--workers`), as in the S5 experiment.
3. evaluation of the validation loss on the held-out documents: T²MLR on the exact (token-by-token)
   recurrence and on the Jacobi path at the training depth, the Transformer on its only path.

Writes OUT/results.md, OUT/results.json, OUT/loss_curves.png, the data under OUT/data and one run
directory per model. `--resume` continues interrupted runs; exit codes: 0 done, 1 training stopped (a
non-finite loss), 2 bad input or an existing run directory.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["PRESETS", "PretrainPreset", "add_experiment", "run_pretrain"]


@dataclass(frozen=True)
class PretrainPreset:
    """Everything a run of the experiment depends on (recorded in results.json)."""

    name: str
    sources: tuple[str, ...]           # offline corpus sources (t2mlr.corpus.offline)
    vocab: int                         # BPE vocabulary trained on the train split
    max_train_documents: int | None    # tokenize at most this many train documents (None: all)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    middle: tuple[int, int]            # the middle block of "T²MLR middle" (1-based, inclusive)
    d_forward: int
    d_backward: int
    seq_len: int
    batch: int
    steps: int
    lr: float
    warmup: int
    eval_every: int
    eval_batches: int                  # held-out batches of eval_batch_size rows for the final table
    eval_batch_size: int

    @property
    def description(self) -> str:
        return (f"{self.layers}-block Llama, hidden {self.hidden}, {self.heads} heads ({self.kv_heads} key-value), "
                f"MLP {self.intermediate}, vocab {self.vocab}; {self.steps} steps of {self.batch} × {self.seq_len} "
                f"tokens, AdamW (0.9, 0.98), wd 0.01, lr {self.lr:g} cosine to 0.1×; Jacobi training "
                f"d_forward {self.d_forward}, d_backward {self.d_backward}")


PRESETS: dict[str, PretrainPreset] = {
    # About 10 minutes of CPU time (one core; 42 min of wall clock on a 2-core machine shared by five
    # sessions) for the corpus, the three trainings and the evaluation: results/pretrain_cpu.
    "cpu": PretrainPreset(
        name="cpu", sources=("python-docs",), vocab=4096, max_train_documents=None,
        hidden=128, layers=6, heads=4, kv_heads=2, intermediate=352, middle=(3, 4), d_forward=8, d_backward=2,
        seq_len=128, batch=8, steps=250, lr=2e-3, warmup=25, eval_every=50, eval_batches=8, eval_batch_size=16,
    ),
    # Seconds: checks that every step of the pipeline runs (the numbers mean nothing).
    "tiny": PretrainPreset(
        name="tiny", sources=("python-docs",), vocab=512, max_train_documents=40,
        hidden=32, layers=4, heads=2, kv_heads=1, intermediate=64, middle=(2, 3), d_forward=3, d_backward=2,
        seq_len=32, batch=4, steps=6, lr=2e-3, warmup=2, eval_every=3, eval_batches=2, eval_batch_size=4,
    ),
}

ARMS = ("t2mlr_middle", "t2mlr_full", "transformer")


# ---------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Path
    train_shards: Path
    validation_shards: Path
    summary: dict[str, Any]


def prepare_data(preset: PretrainPreset, data_dir: Path, corpus: Path | None = None, workers: int = 1) -> PreparedData:
    """Corpus, tokenizer and token shards under `data_dir`; each step is skipped when its output is
    already there (a finished shard directory is left alone by `tokenize_corpus`)."""
    from t2mlr.corpus import (
        prepare_offline_corpus,
        read_manifest,
        tokenize_corpus,
        train_bpe_tokenizer,
    )
    from t2mlr.corpus.offline import iter_texts
    from t2mlr.utils import load_tokenizer

    data_dir.mkdir(parents=True, exist_ok=True)
    text_dir = corpus if corpus is not None else data_dir / "english"
    if corpus is None and not (text_dir / "validation.jsonl").is_file():
        prepare_offline_corpus(text_dir, sources=preset.sources)
    for split in ("train", "validation"):
        if not (text_dir / f"{split}.jsonl").is_file():
            raise ValueError(f"--corpus {text_dir}: no {split}.jsonl (write one with `t2mlr corpus prepare-offline DIR`)")
    tokenizer_dir = data_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_bpe_tokenizer(iter_texts(text_dir / "train.jsonl"), preset.vocab, tokenizer_dir)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    shards = {}
    for split, limit in (("train", preset.max_train_documents), ("validation", None)):
        shards[split] = data_dir / f"{split}_shards"
        tokenize_corpus(text_dir / f"{split}.jsonl", tokenizer, shards[split], workers=workers, max_documents=limit)
    summary = {split: {k: read_manifest(path)[k] for k in ("num_documents", "num_tokens")}
               for split, path in shards.items()}
    summary["corpus"] = str(text_dir)
    return PreparedData(tokenizer_dir, shards["train"], shards["validation"], summary)


# ---------------------------------------------------------------------------------------------- configs


def config_tree(preset: PretrainPreset, data: PreparedData, device: str = "cpu") -> dict[str, Any]:
    """The trainer config (as a plain tree) of the T²MLR middle arm; the other arms derive from it."""
    shards = {"source": "shards", "tokenizer": str(data.tokenizer), "seq_len": preset.seq_len}
    return {
        "model": {
            "arch": "t2mlr",
            "base": {"model_type": "llama", "vocab_size": preset.vocab, "hidden_size": preset.hidden,
                     "intermediate_size": preset.intermediate, "num_hidden_layers": preset.layers,
                     "num_attention_heads": preset.heads, "num_key_value_heads": preset.kv_heads,
                     "max_position_embeddings": max(512, preset.seq_len), "rope_theta": 10000.0,
                     "tie_word_embeddings": True},
            "l_start": preset.middle[0], "l_end": preset.middle[1],
            "d_forward": preset.d_forward, "d_backward": preset.d_backward,
            "train_recurrence": "jacobi", "eval_recurrence": "exact",
        },
        "data": {**shards, "path": str(data.train_shards), "seed": 0},
        "optim": {"lr": preset.lr, "betas": [0.9, 0.98], "weight_decay": 0.01, "grad_clip": 1.0},
        "schedule": {"kind": "cosine", "warmup_steps": preset.warmup, "min_lr_ratio": 0.1},
        "train": {"max_steps": preset.steps, "global_batch_size": preset.batch, "micro_batch_size": preset.batch,
                  "seed": 0, "device": device, "precision": "fp32"},
        # periodic evaluation on the Jacobi path (the exact one is sequential in the tokens); the final
        # table evaluates both
        "eval": {"every": preset.eval_every, "max_batches": 2, "batch_size": preset.eval_batch_size,
                 "recurrence": "jacobi", "data": {**shards, "path": str(data.validation_shards)}},
        "checkpoint": {"every": preset.eval_every, "keep_last": 2},
        "logging": {"every": 1, "progress_bar": True},
    }


def build_arms(preset: PretrainPreset, tree: dict[str, Any]) -> list[Any]:
    """T²MLR middle, T²MLR full and the parameter-matched Transformer (analysis arms: name, label, config)."""
    from t2mlr.analysis.arms import arm_from_tree, transformer_arm

    lo, hi = preset.middle
    return [
        arm_from_tree(tree, "t2mlr_middle", f"T²MLR({lo},{hi}) middle"),
        arm_from_tree(tree, "t2mlr_full", f"T²MLR(1,{preset.layers}) full",
                      ["model.l_start=1", f"model.l_end={preset.layers}"]),
        transformer_arm(tree),
    ]


# ---------------------------------------------------------------------------------------------- evaluation


def evaluate(preset: PretrainPreset, arms: list[Any], run_dirs: dict[str, Path]) -> list[dict[str, Any]]:
    """One table row per (model, forward path): validation loss and perplexity on the same held-out rows."""
    from t2mlr.analysis.arms import validation_batches
    from t2mlr.analysis.common import (
        describe_model,
        load_analysis_model,
        validation_loss,
    )
    from t2mlr.training.trainer import FINAL_DIR

    batches = validation_batches(arms[0].config, preset.eval_batches)
    jacobi = {"recurrence": "jacobi", "d_forward": preset.d_forward, "d_backward": preset.d_backward}
    rows = []
    for arm in arms:
        model = load_analysis_model(run_dirs[arm.name] / FINAL_DIR, device=str(arm.config.train.device))
        paths = [("plain", {})] if arm.name == "transformer" else [("exact", {"recurrence": "exact"}),
                                                                    (f"jacobi (d_forward {preset.d_forward})", jacobi)]
        for path, call in paths:
            result = validation_loss(model, batches, **call)
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


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points (the first points average what there is)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_curves(curves: dict[str, dict[str, list[tuple[int, float]]]], labels: dict[str, str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, curve in curves.items():
        steps, losses = zip(*curve["train"], strict=True) if curve["train"] else ((), ())
        left.plot(steps, _smooth(list(losses), 10), label=labels[name])
        if curve["eval"]:
            right.plot(*zip(*curve["eval"], strict=True), marker="o", markersize=3, label=labels[name])
    left.set(xlabel="training step", ylabel="training loss (nats/token, mean of 10 steps)", title="training")
    right.set(xlabel="training step", ylabel="validation loss (Jacobi path for T²MLR)", title="held-out text")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- report


def results_markdown(preset: PretrainPreset, data: PreparedData, rows: list[dict[str, Any]],
                     seconds: dict[str, float], workers: int) -> list[str]:
    from t2mlr.analysis.common import table

    best = min(row["loss"] for row in rows)
    body = [[row["label"], row["path"], f"{row['parameters']:,}", f"{row['loss']:.4f}" + (" ←" if row["loss"] == best else ""),
             f"{row['ppl']:.2f}", f"{seconds[row['model']] / 60:.1f}"] for row in rows]
    return [
        f"# Pretraining on offline English text (`t2mlr experiment pretrain --preset {preset.name}`)",
        "",
        f"Corpus: {data.summary['corpus']} ({', '.join(preset.sources)}); train "
        f"{data.summary['train']['num_documents']:,} documents / {data.summary['train']['num_tokens']:,} tokens, "
        f"held-out validation {data.summary['validation']['num_documents']:,} documents / "
        f"{data.summary['validation']['num_tokens']:,} tokens (split by document id, none shared).",
        f"Models: {preset.description}. The Transformer is the backbone widened to the smallest width with at "
        "least T²MLR's parameters.",
        f"Validation: the first {preset.eval_batches} batches of {preset.eval_batch_size} rows of "
        f"{preset.seq_len} tokens of the held-out shards, the same rows for every model; loss in nats/token.",
        f"Scheduling: {workers} worker process(es) side by side.",
        "",
        *table(["model", "path", "parameters", "validation loss", "perplexity", "train minutes"], body),
        "",
        "Curves: loss_curves.png (training loss, and the periodic validation loss on 2 batches).",
    ]


def run_pretrain(preset: PretrainPreset, out: str | Path, *, corpus: str | Path | None = None, device: str = "cpu",
                 workers: int | None = None, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """The whole pipeline (see the module docstring); returns what results.json holds."""
    import torch

    from t2mlr.analysis.common import write_result
    from t2mlr.experiments.concurrent_runs import RunJob, resolve_workers, train_runs
    from t2mlr.training.runs import claim_run_dirs

    out = Path(out)
    claim_run_dirs(out, ARMS, resume=resume, overwrite=overwrite)
    started = time.perf_counter()
    data = prepare_data(preset, out / "data", Path(corpus) if corpus is not None else None)
    arms = build_arms(preset, config_tree(preset, data, device))
    run_dirs = {arm.name: out / arm.name for arm in arms}
    count = resolve_workers(workers, len(arms), torch.device(device))
    trained = train_runs([RunJob(arm.name, arm.config, run_dirs[arm.name]) for arm in arms], resume=resume,
                         workers=count)
    seconds = {name: run.seconds for name, run in trained.items()}
    rows = evaluate(preset, arms, run_dirs)
    curves = loss_curves(run_dirs)
    plot_curves(curves, {arm.name: arm.label for arm in arms}, out / "loss_curves.png")
    payload = {"preset": {**asdict(preset), "description": preset.description}, "data": data.summary,
               "results": rows, "train_seconds": seconds, "workers": count, "torch_threads": torch.get_num_threads(),
               "wall_seconds": time.perf_counter() - started, "curves": curves}
    write_result(out, "results", results_markdown(preset, data, rows, seconds, count), payload)
    return payload


# ---------------------------------------------------------------------------------------------- command


def _run_command(args: argparse.Namespace) -> int:
    import torch

    from t2mlr.training.exit_codes import run_with_exit_codes

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    if args.steps is not None:
        preset = replace(preset, steps=args.steps)
    code, payload = run_with_exit_codes("t2mlr experiment pretrain", lambda: run_pretrain(
        preset, args.out, corpus=args.corpus, device=args.device, workers=args.workers, resume=args.resume,
        overwrite=args.overwrite))
    if payload is None:
        return code
    for row in payload["results"]:
        print(json.dumps({k: row[k] for k in ("model", "path", "loss", "ppl")}))
    print(f"wrote {Path(args.out) / 'results.md'}")
    return 0


def add_experiment(sub: Any) -> None:
    """Add `pretrain` to the `t2mlr experiment` group (heavy imports stay inside the handler)."""
    p = sub.add_parser("pretrain", help="pretrain T²MLR middle / full and the matched Transformer on offline English text",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=tuple(PRESETS), default="cpu", help="settings (default: cpu)")
    p.add_argument("--out", type=Path, default=Path("runs/pretrain"), help="output directory (default: runs/pretrain)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="a prepared corpus directory (train.jsonl, validation.jsonl) instead of building one")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=None, help="override the preset's training steps")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads in all, split between the workers")
    p.add_argument("--workers", type=int, default=None,
                   help="models trained at a time (default: one per model up to the CPU threads)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue the runs in --out from their checkpoints")
    group.add_argument("--overwrite", action="store_true", help="delete the runs in --out first")
    p.set_defaults(func=_run_command)
