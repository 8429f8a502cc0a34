"""The dry run's memory estimate (`t2mlr.training.sizing`) against the memory a training step really holds.

For small models on every training path (T²MLR Jacobi and exact, activation checkpointing, a BPTT window,
bf16 autocast; the Transformer, looped and pause-token baselines), each case runs two steps of the real
trainer (`Trainer.train_step`, two micro-batches each, so the second micro-batch's backward holds the first
one's gradients as a real run's do) and compares:

* measured: the bytes of the weights, buffers and AdamW state a step starts from (summed over the distinct
  storages), plus the peak of the bytes torch's CPU allocator holds during the second step, from
  torch.profiler's allocation events (`profile_memory=True`);
* estimated: `estimate_memory(...).peak` for the same config, one CPU device.

Why the profiler and not RSS: it counts exactly the bytes tensors request, allocation by allocation, in
order, so its running sum's peak is the step's high-water mark, the same on every run. RSS (resident pages)
moves with glibc malloc's arenas and caching (freed memory is kept for reuse; small blocks never go back to
the system), with page granularity, and with everything else in the process; ru_maxrss is a high-water mark
since the process started, so a step after the first cannot be isolated. On a GPU the same comparison would
read `torch.cuda.max_memory_allocated()`.

One torch thread (timings are not the point; the allocations do not depend on it).

    python benchmarks/memory_estimate.py                   # every case
    python benchmarks/memory_estimate.py --cases required  # the three shapes on both paths (what the test runs)
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from t2mlr.analysis.benchmarking import machine_info, print_report
from t2mlr.training.config import (
    TrainConfig,
    apply_overrides,
    config_from_tree,
    load_yaml_tree,
    resolve_config_path,
)
from t2mlr.training.sizing import MemoryEstimate, estimate_memory, model_facts, plan_for

# Three small decoder shapes: grouped-query Llama, multi-head Llama with d_backward = d_forward (the seed pass
# carries gradients), Qwen3 with q/k norms and a single key/value head. Rows pack several documents, so
# every attention call gets a 4D mask, as in pretraining.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-gqa": {
        "base": {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 160,
                 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2},
        "recurrence": {"l_start": 2, "l_end": 3, "d_forward": 4, "d_backward": 2}, "seq_len": 32,
    },
    "llama-mha": {
        "base": {"model_type": "llama", "vocab_size": 128, "hidden_size": 96, "intermediate_size": 256,
                 "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 6},
        "recurrence": {"l_start": 2, "l_end": 4, "d_forward": 3, "d_backward": 3}, "seq_len": 32,
    },
    "qwen3-mqa": {
        "base": {"model_type": "qwen3", "vocab_size": 200, "hidden_size": 80, "head_dim": 20, "intermediate_size": 192,
                 "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1},
        "recurrence": {"l_start": 3, "l_end": 4, "d_forward": 4, "d_backward": 2}, "seq_len": 40,
    },
}

# Training paths of T²MLR (model settings, trainer overrides) and the baselines' model sections.
PATHS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "jacobi": ({"train_recurrence": "jacobi"}, []),
    "exact": ({"train_recurrence": "exact"}, []),
    "jacobi, checkpointed": ({"train_recurrence": "jacobi", "activation_checkpointing": True}, []),
    "exact, bptt_window 3": ({"train_recurrence": "exact", "bptt_window": 3}, []),
    "jacobi, bf16 autocast": ({"train_recurrence": "jacobi"}, ["train.precision=bf16"]),
}
BASELINES: dict[str, dict[str, Any]] = {
    "transformer": {"arch": "transformer"},
    "looped 2-3 ×3": {"arch": "looped", "loop_blocks": "2-3", "loops": 3},
    "looped 2-3 ×3, checkpointed": {"arch": "looped", "loop_blocks": "2-3", "loops": 3, "activation_checkpointing": True},
    "pause ×2": {"arch": "pause", "pauses": 1},
}
BATCH = ["train.global_batch_size=8", "train.micro_batch_size=4"]  # two micro-batches per step
QUIET = ["eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false", "logging.progress_bar=false"]


@dataclass(frozen=True)
class Case:
    shape: str
    path: str
    model: dict[str, Any]
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.shape}, {self.path}"


def t2mlr_case(shape: str, path: str) -> Case:
    settings, overrides = PATHS[path]
    model = {"arch": "t2mlr", "base": {**SHAPES[shape]["base"], "tie_word_embeddings": True},
             **SHAPES[shape]["recurrence"], **settings}
    return Case(shape, path, model, overrides)


def baseline_case(name: str) -> Case:
    return Case("llama-gqa", name, {**BASELINES[name], "base": {**SHAPES["llama-gqa"]["base"], "tie_word_embeddings": True}})


REQUIRED = [t2mlr_case(shape, path) for shape in SHAPES for path in ("jacobi", "exact")]
EXTRA = [t2mlr_case(shape, path) for shape in SHAPES for path in PATHS if path not in ("jacobi", "exact")]
EXTRA += [baseline_case(name) for name in BASELINES]


def case_config(case: Case) -> TrainConfig:
    """The debug preset (synthetic packed rows) around the case's model, two micro-batches per step, on the CPU."""
    tree = load_yaml_tree(resolve_config_path("debug"))
    tree["model"] = case.model
    vocab, seq_len = case.model["base"]["vocab_size"], SHAPES[case.shape]["seq_len"]
    data = [f"data.seq_len={seq_len}", f"data.kwargs.vocab_size={vocab}"]
    return config_from_tree(apply_overrides(tree, [*BATCH, *QUIET, *data, *case.overrides]))


def peak_allocated(work: Callable[[], object]) -> float:
    """Peak bytes torch's CPU allocator holds beyond what it held before `work()`, from the profiler's
    allocation events in time order."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    events, pending = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    held = peak = 0.0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak


def storage_bytes(tensors: Sequence[torch.Tensor]) -> float:
    """Bytes of the distinct storages among `tensors` (a tied embedding and head counted once)."""
    return float(sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()))


def step_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What a step starts from: weights, buffers and AdamW's state (its step counters are scalars)."""
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [value for value in state.values() if isinstance(value, torch.Tensor)]
    return tensors


def measure(cfg: TrainConfig, out_dir: Path) -> tuple[float, MemoryEstimate]:
    """(measured peak bytes of the second training step, the sizing module's estimate for the config)."""
    from t2mlr.training.trainer import Trainer

    trainer = Trainer(cfg, out_dir)
    try:
        trainer.train_step(next(trainer.batches))  # the first step creates AdamW's state
        held = storage_bytes(step_state(trainer.model, trainer.optimizer))
        measured = held + peak_allocated(lambda: trainer.train_step(next(trainer.batches)))
    finally:
        trainer.metrics.close()
    plan = plan_for(cfg, 1, "none", device_type="cpu")
    return measured, estimate_memory(model_facts(cfg.model), plan, cfg.data.seq_len, cfg.model.activation_checkpointing)


def mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all",
                        help="all, required, or case names or paths separated by ';' (e.g. 'llama-gqa, exact;pause ×2')")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.disable(logging.INFO)  # the trainer's set-up lines, once per case
    cases = {"all": REQUIRED + EXTRA, "required": REQUIRED}.get(args.cases)
    if cases is None:
        wanted = [name.strip() for name in args.cases.split(";")]
        cases = [case for case in REQUIRED + EXTRA if case.name in wanted or case.path in wanted]
        if not cases:
            parser.error(f"no case named {args.cases!r}; cases: {'; '.join(c.name for c in REQUIRED + EXTRA)}")
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as out:
            measured, estimate = measure(case_config(case), Path(out))
        rows.append([case.shape, case.path, mib(estimate.states), mib(estimate.activations_total),
                     mib(estimate.backward_transient), mib(estimate.peak), mib(measured),
                     f"{estimate.peak / measured:.3f}"])
        print(" | ".join(rows[-1]), flush=True)
    print_report("Memory estimate against the measured peak of a training step", machine_info(torch.device("cpu")),
                 "memory_estimate.py", argv,
                 ["shape", "path", "weights, gradients, AdamW MiB", "activations MiB", "backward transient MiB", "estimate MiB",
                  "measured MiB", "estimate / measured"], rows)


if __name__ == "__main__":
    main()
