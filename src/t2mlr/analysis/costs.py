"""What each arm of a comparison costs, measured side by side: a training step and a decoded token.

Why a separate measurement: an experiment's own training times are wall-clock times of runs that share
the machine with each other and with whatever else runs there, so they say little about what an arm
costs. Here every arm is built exactly as the experiment builds it (its trainer config, its model, its
optimizer: `t2mlr.training.arms.Arm`), in one process on one torch thread, and timed in paired
rounds: each round runs every arm once on the same batch, in an order rotated from round to round, and
an arm's cost is the median over rounds of its time divided by the reference arm's time in the same
round (far less sensitive to a burst of foreign load than a ratio of two separate medians;
`t2mlr.analysis.benchmarking`).

* Training step: the trainer's own `Trainer.train_step` (forward, backward, gradient clipping, AdamW)
  on the reference arm's training batches (S5: its stream, batch 64 on `cpu`); the batches are drawn once up front
  so drawing them is not timed. Beside each ratio, the FLOP model's (`t2mlr.baselines.costs`, at the
  batch's mean row length).
* Decoding: `generate()` of `new_tokens` tokens greedily from BOS with the KV cache (T²MLR: exact
  prefill, then its decode step), per token; random weights (decoding time does not depend on them),
  T²MLR's gates set off the identity so R reaches the output.

S5-Retrieval's `transformer:compute-matched` is derived from this: its steps are T²MLR's steps times the
measured T²MLR-exact / Transformer training-step ratio (`task.compute_matched_ratio` of its configs).
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from t2mlr.analysis.benchmarking import machine_info, median_ratio, open_gates, timed
from t2mlr.baselines.costs import decode_flops, train_step_flops
from t2mlr.model import is_t2mlr
from t2mlr.training.arms import Arm, fixed_threads
from t2mlr.training.trainer import Trainer

__all__ = ["ArmCost", "measure_costs", "paired_ratios"]

CPU = torch.device("cpu")


@dataclass
class ArmCost:
    """One arm's measured cost against the reference arm (medians over paired rounds)."""

    name: str
    label: str
    median_seconds: float
    median_ratio: float  # median over rounds of (this arm's time / the reference's time in the same round)
    flop_ratio: float | None  # the FLOP model's ratio at the same shapes


def paired_ratios(calls: dict[str, Callable[[int], object]], reference: str, rounds: int,
                  desc: str = "rounds") -> dict[str, tuple[float, float]]:
    """Time every call once per round (`call(round)`), rotating the order each round; returns per name the
    median seconds and the median of per-round ratios to `reference`."""
    if reference not in calls:
        raise ValueError(f"the reference {reference!r} is not among the timed arms {sorted(calls)}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in tqdm(range(rounds), desc=desc, unit="round", dynamic_ncols=True):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(lambda name=name, index=index: calls[name](index), CPU))
    return {name: (statistics.median(values), median_ratio(values, times[reference])) for name, values in times.items()}


def _trainers(arms: Sequence[Arm], root: Path) -> dict[str, Trainer]:
    """A trainer per arm, from the arm's own config (on the CPU, in a scratch directory)."""
    trainers = {}
    for arm in arms:
        cfg = replace(arm.config, train=replace(arm.config.train, device="cpu"),
                      logging=replace(arm.config.logging, progress_bar=False))
        trainers[arm.name] = Trainer(cfg, root / arm.dir_name)
    return trainers


def _training_costs(trainers: dict[str, Trainer], labels: dict[str, str], reference: str, rounds: int, warmup: int
                    ) -> list[ArmCost]:
    batches = [next(trainers[reference].batches) for _ in range(rounds + warmup)]
    for trainer in trainers.values():  # untimed: first-call allocations, lazy initialisation
        for batch in batches[:warmup]:
            trainer.train_step(batch)
    timed_batches = batches[warmup:]
    calls = {name: (lambda index, t=trainer: t.train_step(timed_batches[index])) for name, trainer in trainers.items()}
    measured = paired_ratios(calls, reference, rounds, desc="training steps")
    lengths = [int(b["input_ids"].shape[1]) for batch in timed_batches for b in batch]
    mean_length = round(statistics.mean(lengths))
    reference_flops = train_step_flops(trainers[reference].model.config, mean_length)
    return [ArmCost(name, labels[name], *measured[name],
                    train_step_flops(trainer.model.config, mean_length) / reference_flops)
            for name, trainer in trainers.items()]


def _greedy(model: torch.nn.Module, new_tokens: int) -> Callable[[int], object]:
    bos = torch.tensor([[model.config.bos_token_id]])
    extra = {"prefill": "exact"} if is_t2mlr(model) else {}

    def run(_: int) -> torch.Tensor:
        with torch.no_grad():
            out = model.generate(input_ids=bos, attention_mask=torch.ones_like(bos), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.pad_token_id,
                                 **extra)
        if out.shape[1] != new_tokens + 1:
            raise RuntimeError(f"generated {out.shape[1] - 1} tokens instead of {new_tokens}")
        return out

    return run


def _decoding_costs(trainers: dict[str, Trainer], labels: dict[str, str], reference: str, rounds: int, new_tokens: int
                    ) -> list[ArmCost]:
    models = {name: trainer.model.eval() for name, trainer in trainers.items()}
    for model in models.values():
        if is_t2mlr(model):
            open_gates(model)
    calls = {name: _greedy(model, new_tokens) for name, model in models.items()}
    for call in calls.values():
        call(0)  # untimed warm-up
    measured = paired_ratios(calls, reference, rounds, desc="decoding")
    reference_flops = decode_flops(models[reference].config, new_tokens)
    return [ArmCost(name, labels[name], seconds / new_tokens, ratio,
                    decode_flops(models[name].config, new_tokens) / reference_flops)
            for name, (seconds, ratio) in measured.items()]


def measure_costs(arms: Sequence[Arm], reference: str = "transformer", rounds: int = 21, warmup: int = 2,
                  decode_rounds: int = 11, new_tokens: int = 64, threads: int = 1) -> dict[str, Any]:
    """Training-step and decoding costs of `arms` against the arm named `reference`, on `threads` torch threads
    (see the module docstring). Returns a JSON-ready dict with the machine description."""
    if reference not in [arm.name for arm in arms]:
        raise ValueError(f"the reference {reference!r} is not among the arms {[arm.name for arm in arms]}")
    labels = {arm.name: arm.label for arm in arms}
    with fixed_threads(threads), tempfile.TemporaryDirectory(prefix="costs_") as scratch:
        info = machine_info(CPU)
        trainers = _trainers(arms, Path(scratch))
        try:
            training = _training_costs(trainers, labels, reference, rounds, warmup)
            decoding = _decoding_costs(trainers, labels, reference, decode_rounds, new_tokens) if decode_rounds else []
        finally:
            for trainer in trainers.values():
                trainer.metrics.close()
    return {
        "reference": reference, "threads": threads, "rounds": rounds, "warmup": warmup,
        "decode_rounds": decode_rounds, "new_tokens": new_tokens, "machine": info,
        "training": [asdict(cost) for cost in training], "decoding": [asdict(cost) for cost in decoding],
    }
