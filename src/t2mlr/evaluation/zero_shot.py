"""The paper's zero-shot table: seven lm-evaluation-harness tasks, one row per checkpoint.

    t2mlr eval zero-shot runs/135m_13_18/final runs/135m_baseline/final --out results/zero_shot
    t2mlr eval zero-shot CKPT --out DIR --data-dir data/lm_eval --limit 200 --batch-size 16

Tasks and metrics as in the paper's Tables eval_135m / eval_scale / layer_location / compute_matched:
ARC-Challenge, ARC-Easy, HellaSwag, OpenBookQA, PIQA, SciQ (normalised accuracy, acc_norm) and Winogrande
(accuracy), zero-shot, with lm-eval's own task definitions (prompts, choices, metrics); the last column is
their unweighted mean. Every T²MLR checkpoint is scored on the path `--recurrence` names (exact by
default, or jacobi with `--d-forward`), and the table records it; a plain model (a baseline) has none.
`--exit-layer E` scores every checkpoint with the blocks after block E skipped (early exit, recorded in the
path column; `t2mlr.evaluation.early_exit`).

Local copies (`--data-dir DIR`, for machines without the hub): one file per task, holding the split
lm-eval evaluates, rows in the schema of the hub dataset the task reads (a `datasets` export of that
split as jsonl, or its parquet file):

    DIR/arc_challenge/test.jsonl   allenai/ai2_arc ARC-Challenge: id, question, choices {text, label}, answerKey
    DIR/arc_easy/test.jsonl        allenai/ai2_arc ARC-Easy: the same fields
    DIR/hellaswag/validation.jsonl Rowan/hellaswag: ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id,
                                   split, split_type, label
    DIR/openbookqa/test.jsonl      allenai/openbookqa main: id, question_stem, choices {text, label}, answerKey
    DIR/piqa/validation.jsonl      baber/piqa: goal, sol1, sol2, label
    DIR/sciq/test.jsonl            allenai/sciq: question, distractor1, distractor2, distractor3, correct_answer,
                                   support
    DIR/winogrande/validation.jsonl allenai/winogrande winogrande_xl: sentence, option1, option2, answer

(`.parquet` instead of `.jsonl` works too.) E.g. on a machine with the hub:
`datasets.load_dataset("allenai/sciq", split="test").to_json("DIR/sciq/test.jsonl")`. A missing file is
an error that lists every missing one; nothing falls back to the hub.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t2mlr.utils import check_model_dir

__all__ = [
    "PAPER_TASKS",
    "MissingTaskDataError",
    "ZeroShotTask",
    "local_task_config",
    "local_task_files",
    "run_zero_shot",
    "table_markdown",
    "zero_shot_row",
]


@dataclass(frozen=True)
class ZeroShotTask:
    name: str      # lm-eval task name
    column: str    # the paper's column header
    metric: str    # lm-eval metric the paper reports
    split: str     # the split lm-eval evaluates (its test_split, else its validation_split)
    source: str    # the hub dataset the task reads, for the layout's documentation
    directory: str  # the task's folder among lm-eval's task definitions


PAPER_TASKS: tuple[ZeroShotTask, ...] = (
    ZeroShotTask("arc_challenge", "ARC-C", "acc_norm", "test", "allenai/ai2_arc ARC-Challenge", "arc"),
    ZeroShotTask("arc_easy", "ARC-E", "acc_norm", "test", "allenai/ai2_arc ARC-Easy", "arc"),
    ZeroShotTask("hellaswag", "HS", "acc_norm", "validation", "Rowan/hellaswag", "hellaswag"),
    ZeroShotTask("openbookqa", "OBQA", "acc_norm", "test", "allenai/openbookqa main", "openbookqa"),
    ZeroShotTask("piqa", "PIQA", "acc_norm", "validation", "baber/piqa", "piqa"),
    ZeroShotTask("sciq", "SciQ", "acc_norm", "test", "allenai/sciq", "sciq"),
    ZeroShotTask("winogrande", "WG", "acc", "validation", "allenai/winogrande winogrande_xl", "winogrande"),
)
LOCAL_SUFFIXES = (".jsonl", ".parquet")
SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


class MissingTaskDataError(ValueError):
    """`--data-dir` lacks the files of some tasks; the message lists every one."""


# ---------------------------------------------------------------------------------------------- local data


def local_task_files(data_dir: str | Path, tasks: Sequence[ZeroShotTask] = PAPER_TASKS) -> dict[str, Path]:
    """Each task's local file under `data_dir` (see the module docstring for the layout)."""
    data_dir = Path(data_dir)
    found, missing = {}, []
    for task in tasks:
        candidates = [data_dir / task.name / f"{task.split}{suffix}" for suffix in LOCAL_SUFFIXES]
        present = [path for path in candidates if path.is_file()]
        if present:
            found[task.name] = present[0]
        else:
            missing.append(f"  {task.name}/{task.split}.jsonl (or .parquet): the {task.split} split of {task.source}")
    if missing:
        raise MissingTaskDataError(f"--data-dir {data_dir} lacks the data of {len(missing)} task(s):\n"
                                   + "\n".join(missing) + "\n(layout: `t2mlr eval zero-shot --help`)")
    return found


@functools.lru_cache(maxsize=4)
def task_manager(directories: tuple[str, ...]) -> Any:
    """lm-eval's TaskManager over the folders of the given tasks only: indexing all of lm-eval's thousands
    of task files takes about ten CPU-seconds, these few a fraction of one."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.__file__).parent / "tasks"
    return TaskManager(include_path=[str(root / name) for name in directories], include_defaults=False)


def _manager_for(tasks: Sequence[ZeroShotTask]) -> Any:
    return task_manager(tuple(sorted({task.directory for task in tasks})))


def _registered_config(task: ZeroShotTask) -> dict[str, Any]:
    """lm-eval's own config of a task, with its `!function` entries resolved (what lm-eval builds it from)."""
    from lm_eval.tasks._yaml_loader import (
        load_yaml,  # lm-eval's loader: includes and !function as it does them
    )

    name = task.name
    entry = _manager_for([task]).task_index.get(name)
    if entry is None or entry.yaml_path is None:
        raise ValueError(f"lm-eval {_lm_eval_version()} has no task {name!r}")
    return dict(load_yaml(entry.yaml_path, resolve_func=True))


def local_task_config(task: ZeroShotTask, file: Path) -> dict[str, Any]:
    """lm-eval's config of `task` reading its evaluated split from `file` instead of the hub.

    Only where the documents come from changes: the builder (`json` or `parquet`) and its data_files, and
    the splits the local copy does not hold are unset (zero-shot reads no training documents)."""
    config = _registered_config(task)
    evaluated = config.get("test_split") or config.get("validation_split")
    if evaluated != task.split:
        raise ValueError(f"lm-eval's {task.name} evaluates split {evaluated!r}, expected {task.split!r}")
    config.update({
        "dataset_path": "parquet" if file.suffix == ".parquet" else "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {task.split: str(file)}},
    })
    for key in SPLIT_KEYS:
        if config.get(key) not in (None, task.split):
            config[key] = None
    return config


def task_specs(data_dir: str | Path | None, tasks: Sequence[ZeroShotTask] = PAPER_TASKS) -> list[str | dict[str, Any]]:
    """What `simple_evaluate(tasks=...)` gets: the task names (hub data), or local configs."""
    if data_dir is None:
        return [task.name for task in tasks]
    files = local_task_files(data_dir, tasks)
    return [local_task_config(task, files[task.name]) for task in tasks]


# ---------------------------------------------------------------------------------------------- the table


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def zero_shot_row(label: str, results: Mapping[str, Any], tasks: Sequence[ZeroShotTask] = PAPER_TASKS) -> dict[str, Any]:
    """One table row from lm-eval's results dict (`simple_evaluate`'s return, or its results json):
    each task's metric in percent, their mean, and the recurrence path the model was scored on."""
    scores, missing = {}, []
    per_task = results.get("results", {})
    for task in tasks:
        value = per_task.get(task.name, {}).get(f"{task.metric},none")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            missing.append(f"{task.name} {task.metric}")
            continue
        scores[task.column] = 100.0 * float(value)
    if missing:
        raise ValueError(f"{label}: the lm-eval results lack {', '.join(missing)}")
    config = results.get("config", {})
    recurrence = config.get("t2mlr_recurrence")
    if recurrence == "jacobi":
        path = f"jacobi (d_forward {config.get('t2mlr_d_forward')})"
    else:
        path = {None: "unknown", "none": "plain (no recurrence)", "exact": "exact"}.get(recurrence, str(recurrence))
    if config.get("t2mlr_exit_layer") is not None:
        path += f", exit after block {config['t2mlr_exit_layer']}"
    limit = config.get("limit")
    return {"checkpoint": label, "path": path, **scores, "Average": sum(scores.values()) / len(scores),
            "limit": limit, "samples": {task.name: results.get("n-samples", {}).get(task.name, {}).get("effective")
                                        for task in tasks}}


def table_markdown(rows: Sequence[Mapping[str, Any]], tasks: Sequence[ZeroShotTask] = PAPER_TASKS) -> list[str]:
    """The paper's layout: one row per checkpoint, the seven tasks, the average; best value per column in bold."""
    columns = [task.column for task in tasks] + ["Average"]
    best = {column: max(row[column] for row in rows) for column in columns}
    header = ["Model/Config", "path", *columns]
    metric = ["Metric", "", *[("acc_n" if task.metric == "acc_norm" else task.metric) + " ↑" for task in tasks], "- ↑"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), "| " + " | ".join(metric) + " |"]
    for row in rows:
        cells = [f"**{row[c]:.2f}**" if len(rows) > 1 and row[c] == best[c] else f"{row[c]:.2f}" for c in columns]
        lines.append("| " + " | ".join([row["checkpoint"], row["path"], *cells]) + " |")
    return lines


def _label(checkpoint: str, taken: set[str]) -> str:
    """A short unique name: the run directory for `RUN/final` or `RUN/checkpoints/step_N`, else the path."""
    path = Path(checkpoint)
    parts = path.parts
    if path.name == "final" and len(parts) > 1:
        label = parts[-2]
    elif len(parts) > 2 and parts[-2] == "checkpoints":
        label = f"{parts[-3]}@{path.name}"
    else:
        label = path.name or str(path)
    return label if label not in taken else str(path)


def run_zero_shot(
    checkpoints: Sequence[str], out: str | Path, *, data_dir: str | Path | None = None, limit: int | None = None,
    batch_size: int = 8, recurrence: str = "exact", d_forward: int | None = None, device: str = "auto",
    tasks: Sequence[ZeroShotTask] = PAPER_TASKS, exit_layer: int | None = None,
) -> list[dict[str, Any]]:
    """Evaluate every checkpoint on the tasks and write OUT/zero_shot.md, OUT/zero_shot.json and lm-eval's
    results per checkpoint (OUT/lm_eval/<label>.json); returns the table rows. `exit_layer`: every checkpoint
    scored with the blocks after that one skipped (`t2mlr.evaluation.early_exit`)."""
    if not checkpoints:
        raise ValueError("give at least one checkpoint directory")
    specs = task_specs(data_dir, tasks)  # a missing local file fails here, before any model loads
    for checkpoint in checkpoints:
        check_model_dir(checkpoint)
    if exit_layer is not None:
        from t2mlr.evaluation.early_exit import check_saved_exit_layer

        for checkpoint in checkpoints:
            check_saved_exit_layer(checkpoint, exit_layer)

    import lm_eval

    import t2mlr.evaluation.lm_eval_model  # noqa: F401  (registers the "t2mlr" model with lm-eval)
    from t2mlr.utils import resolve_device

    out = Path(out)
    (out / "lm_eval").mkdir(parents=True, exist_ok=True)
    rows, taken = [], set()
    for checkpoint in checkpoints:
        label = _label(checkpoint, taken)
        taken.add(label)
        model_args = {"pretrained": str(checkpoint), **({} if exit_layer is None else {"exit_layer": exit_layer})}
        results = _evaluate_checkpoint(lm_eval, model_args, specs, limit, recurrence, d_forward, batch_size,
                                       str(resolve_device(device)), _manager_for(tasks))
        raw = out / "lm_eval" / f"{label.replace('/', '_')}.json"
        raw.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
        rows.append({**zero_shot_row(label, results, tasks), "model_dir": str(checkpoint), "lm_eval_results": str(raw)})
    write_table(rows, out, data_dir, tasks)
    return rows


def _evaluate_checkpoint(lm_eval: Any, model_args: dict[str, Any], specs: list[Any], limit: int | None,
                         recurrence: str, d_forward: int | None, batch_size: int, device: str,
                         manager: Any) -> dict[str, Any]:
    """lm-eval's results for one checkpoint; T²MLR models on the chosen path, plain models on theirs."""
    if _is_t2mlr_directory(model_args["pretrained"]):
        model_args = {**model_args, "recurrence": recurrence}
        if d_forward is not None:
            model_args["d_forward"] = d_forward
    results = lm_eval.simple_evaluate(model="t2mlr", model_args=model_args, tasks=specs, num_fewshot=0, limit=limit,
                                      log_samples=False, batch_size=batch_size, device=device,
                                      task_manager=manager)
    return {key: results[key] for key in ("results", "config", "n-samples", "versions") if key in results}


def _is_t2mlr_directory(model_dir: str) -> bool:
    """Whether a saved model is T²MLR (its config.json's model_type), read without loading the weights."""
    from transformers import AutoConfig

    import t2mlr.model  # noqa: F401  (registers the T²MLR config with the Auto classes)

    return AutoConfig.from_pretrained(model_dir).model_type == "t2mlr"


def write_table(rows: Sequence[Mapping[str, Any]], out: str | Path, data_dir: str | Path | None = None,
                tasks: Sequence[ZeroShotTask] = PAPER_TASKS) -> tuple[Path, Path]:
    """OUT/zero_shot.md (the table and how it was made) and OUT/zero_shot.json (the rows)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    limits = {row.get("limit") for row in rows}
    source = f"local copies under {data_dir}" if data_dir is not None else "the hub datasets"
    notes = [
        "",
        f"Zero-shot, lm-evaluation-harness {_lm_eval_version()} task definitions, data from {source}; "
        "acc_n = normalised accuracy (acc_norm), WG = Winogrande accuracy, Average = unweighted mean of the seven.",
        "path: the recurrence path every score of the row was computed on.",
    ]
    if limits != {None}:
        notes.append(f"Only the first {', '.join(str(x) for x in sorted(limits, key=str))} documents of each task "
                     "(--limit): not comparable with the paper's full-split numbers.")
    md = out / "zero_shot.md"
    md.write_text("\n".join([*table_markdown(rows, tasks), *notes]) + "\n", encoding="utf-8")
    js = out / "zero_shot.json"
    js.write_text(json.dumps({"tasks": [task.__dict__ for task in tasks], "rows": list(rows)}, indent=1) + "\n",
                  encoding="utf-8")
    return md, js
