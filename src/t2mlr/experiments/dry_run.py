"""`t2mlr experiment NAME --dry-run`: what an experiment would cost before it is bought.

Every experiment trains its arms with the trainer, one trainer config per arm (`t2mlr.training.arms`). A dry
run builds those arms with the experiment's own arm builder, as the real run would (nothing is written, no
data is read, no weights are allocated), and hands each arm's trainer config to `t2mlr.training.sizing
.size_run`: the same numbers `t2mlr train CONFIG --dry-run` prints for that arm's config.yaml. The arms train
in turn over every device, so the experiment's GPU-hours and wall time are the sums over its arms.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from t2mlr.training.arms import Arm
    from t2mlr.training.sizing import GpuKind, RunSize

__all__ = ["ArmSize", "ExperimentSize", "size_experiment"]

TORCHRUN_NOTE = ("under torchrun the arms train in turn, each over every rank with --parallel; rank 0 prepares the "
                 "data and writes the results, the evaluation is shared out over the ranks (docs/scale.md)")


@dataclass(frozen=True)
class ArmSize:
    """One arm and its sizing, or why the memory model does not cover it (`not_sized`: an LSTM, say)."""

    name: str
    label: str
    directory: str
    run: RunSize | None
    not_sized: str | None = None


@dataclass(frozen=True)
class ExperimentSize:
    """Every arm of an experiment sized on one plan of devices; `table()` prints it, `to_dict()` is --json."""

    command: str
    devices: int
    gpu: GpuKind
    mfu: float
    arms: tuple[ArmSize, ...]
    launch: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def sized(self) -> list[RunSize]:
        return [arm.run for arm in self.arms if arm.run is not None]

    @property
    def gpu_hours(self) -> float:
        """Of the sized arms (a sum over them: the arms train one after another)."""
        return sum(run.gpu_hours for run in self.sized)

    @property
    def wall_hours(self) -> float:
        """The arms train in turn, each over every device."""
        return sum(run.step_seconds * run.steps for run in self.sized) / 3600

    @property
    def steps(self) -> int:
        return sum(run.steps for run in self.sized)

    def to_dict(self) -> dict[str, Any]:
        arms = [{"name": a.name, "label": a.label, "directory": a.directory,
                 **(a.run.to_dict() if a.run is not None else {"not_sized": a.not_sized})} for a in self.arms]
        return {"command": self.command, "devices": self.devices, "gpu": self.gpu.name, "mfu": self.mfu,
                "arms": arms, "total": {"arms": len(self.arms), "sized_arms": len(self.sized), "steps": self.steps,
                                        "gpu_hours": self.gpu_hours, "wall_hours": self.wall_hours},
                "launch": self.launch, "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def table(self) -> str:
        return "\n".join(_table_lines(self))


def _table_lines(size: ExperimentSize) -> list[str]:
    from t2mlr.training.sizing import PARALLEL_LABELS, gib

    mode = PARALLEL_LABELS[size.sized[0].plan.parallel if size.sized else "none"]
    header = ["arm", "parameters", "steps", "tokens/step", "memory/device", "FLOPs/step", "step time", "GPU-hours"]
    rows = [[a.name, f"{a.run.parameters:,}", f"{a.run.steps:,}", f"{a.run.tokens_per_step:,}",
             f"{gib(a.run.memory.peak)} {'fits' if a.run.fits else 'DOES NOT FIT'}", f"{a.run.flops_per_step:.3e}",
             f"{a.run.step_seconds:.3f} s", f"{a.run.gpu_hours:,.2f}"] if a.run is not None
            else [a.name, *["–"] * (len(header) - 1)] for a in size.arms]
    unsized = len(size.arms) - len(size.sized)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [f"{size.command} --dry-run: {size.devices} × {size.gpu.label}, {mode}, MFU {size.mfu:.0%}, "
             f"{len(size.arms)} arm(s) trained in turn", line(header), *map(line, rows),
             (f"  total: {len(size.arms)} arms, {size.steps:,} steps, {size.wall_hours:,.2f} h wall, "
              f"{size.gpu_hours:,.1f} GPU-hours (usable memory {gib(size.gpu.usable_bytes)} per device)"
              + (f"; {unsized} arm(s) not sized, not in the sums" if unsized else "")),
             "arms"]
    for a in size.arms:
        lines.append(f"  {a.name}: {a.label} → OUT/{a.directory}")
        if a.run is None:
            lines.append(f"    not sized: {a.not_sized}")
            continue
        run, memory, plan = a.run, a.run.memory, a.run.plan
        lines += [(f"    {run.model}, {run.training_path}; {run.global_batch} rows × {run.seq_len} tokens (micro-batch "
                   f"{plan.micro_batch} × {plan.devices} device(s) × accumulation {plan.accumulation}), "
                   f"{'bf16 autocast' if plan.precision == 'bf16' else 'fp32'}"),
                  (f"    memory: weights {gib(memory.weights)}, gradients {gib(memory.gradients)}, AdamW "
                   f"{gib(memory.optimizer)}, other states {gib(memory.gathered_parameters + memory.gradient_buckets + memory.autocast_copies)}, "
                   f"activations {gib(memory.activations_total)}, backward peak {gib(memory.backward_transient)}: "
                   f"{gib(memory.peak)}")]
    lines += ["launch", f"  {size.launch}"]
    return lines + [f"note: {note}" for note in size.notes]


def _arm_notes(arms: Sequence[ArmSize]) -> list[str]:
    """Each distinct note of the arms' sizings once, naming the arms it applies to."""
    by_note: dict[str, list[str]] = {}
    for arm in (a for a in arms if a.run is not None):
        for note in (*arm.run.memory.notes, *arm.run.notes):
            by_note.setdefault(note, []).append(arm.name)
    return [note if len(names) == len(arms) else f"{', '.join(names)}: {note}" for note, names in by_note.items()]


def size_experiment(title: str, command: Sequence[str], arms: Sequence[Arm], devices: int, gpu: str, mfu: float,
                    notes: Sequence[str] = ()) -> ExperimentSize:
    """Size every arm on `devices` GPUs of kind `gpu`; `title`: the experiment as typed (`t2mlr experiment
    finetune gsm-aug --preset paper`), `command`: its words after `t2mlr` for the launch line (the data
    parallelism added on several devices). Raises SizingError naming the arm that cannot be sized."""
    from t2mlr.training.sizing import (
        SizingError,
        UnsupportedModelError,
        choose_parallel,
        command_line,
        gpu_kind,
        size_run,
    )

    kind = gpu_kind(gpu)
    if not arms:
        raise SizingError("the experiment has no arms to size")
    sized = []
    for arm in arms:
        run, not_sized = None, None
        try:
            run = size_run(arm.config, devices, gpu, mfu, config_name=f"OUT/{arm.dir_name}/config.yaml")
        except UnsupportedModelError as err:
            not_sized = str(err)
        except SizingError as err:
            raise SizingError(f"arm {arm.name}: {err}") from err
        sized.append(ArmSize(arm.name, arm.label, arm.dir_name, run, not_sized))
    words = list(command)
    if devices > 1 and arms[0].config.train.parallel == "none":
        words += ["--parallel", choose_parallel(arms[0].config, devices)]
    all_notes = [*notes, *_arm_notes(sized)] + ([TORCHRUN_NOTE] if devices > 1 else [])
    return ExperimentSize(title, devices, kind, mfu, tuple(sized),
                          command_line(words, devices), tuple(all_notes))
