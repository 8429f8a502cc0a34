"""The pathfinding experiment (`t2mlr experiment pathfinding`): T²MLR on vs off on the release's shortest-path task.

The authors' release finetunes SmolLM2-135M on its pathfinding data with T²MLR off and on (`paper` preset, as
the release runs it); `cpu` is the same comparison scaled to a CPU (smaller graphs, small models from scratch),
`tiny` a pipeline check. The task is `t2mlr.tasks.pathfinding` (generated rows, or the release's files with
`--data`, every row checked); everything else (arms, data, training, greedy evaluation, results.md /
results.json / predictions.jsonl) is the reasoning finetunes' (`t2mlr.experiments.finetune`), so a pathfinding
run reads and resumes like any finetune run and `t2mlr experiment finetune-summary` gathers its seeds.

Configs: `configs/experiments/pathfinding_{paper,cpu,tiny}.yaml`, a finetune config whose task section is
`PathfindingTask`: `FinetuneTask` plus `pretrained`, the model a preset with `start: retrofit` retrofits (the
command line's `--retrofit` replaces it; a dry run without `--retrofit` sizes the preset's declared backbone and
downloads nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from t2mlr.experiments.finetune import FinetunePlan, make_plan
from t2mlr.experiments.sections import PathfindingTask

__all__ = ["PathfindingTask", "plan"]


def plan(preset: str, task: PathfindingTask, tree: dict[str, Any], arms: str | None = None,
         from_: Sequence[str] | None = None, retrofit: str | None = None, data: str | None = None,
         dry_run: bool = False) -> FinetunePlan:
    """The finetune plan of a pathfinding config: a retrofit preset retrofits `--retrofit` or else
    `task.pretrained` (in a dry run without `--retrofit`: the declared backbone's shape, nothing downloaded)."""
    if retrofit is None and not from_ and task.start == "retrofit" and not dry_run:
        retrofit = task.pretrained
    return make_plan(preset, task, tree, arms, from_, retrofit, data, dry_run=dry_run)
