"""Training-step overhead of T²MLR (Jacobi, d_forward 16 / d_backward 4) over the plain Transformer.

One step = forward + backward + gradient clipping + AdamW, as in the trainer. Three variants share
one base model's weights and shape:

    transformer   the base LlamaForCausalLM, no recurrence module
    t2mlr-fixed   T²MLR(l_start, l_end), Jacobi with all d_forward iterations
    t2mlr-tol     the same with early stopping of the detached Jacobi iterations (--tol)

Timing: `--repeats` rounds; each round runs every variant once (order rotated per round), so the
variants see the same machine conditions. Reported: median step time per variant, and the median
of per-round ratios against the transformer. The paper reports 2.24× for (13,18) at d_forward 16.

Memory: on CUDA, torch.cuda.max_memory_allocated during one step above what was allocated before
it, plus the variant's resident weights and AdamW state. On CPU there is no allocator peak counter,
so each variant runs in a fresh subprocess and a thread samples the resident set size (RSS) during a
step; the peak above the pre-step RSS plus the resident weights and AdamW state is reported (a
coarser measure, labelled as such in the output).

A fresh model has γ = 0, where Φ is the identity and every Jacobi iterate is identical, which
would make early stopping look free. The gates of random models are therefore set to γ_cur = -0.5,
γ_rec = 0.5 (the signs trained models end with, docs/semantics.md §6) before measuring. Early stopping is only
meaningful on a trained model, whose cache converges: `--checkpoint DIR` times a trained T²MLR
(its own shape, placement and gates; the Transformer variant is its base model) on real text rows
from `--data` (a jsonl of {"text"} lines, tokenized with the checkpoint's data tokenizer).

`--models` compares any arms instead, each against the parameter-matched Transformer (the backbone
widened to T²MLR's parameter count, `t2mlr.baselines.matching.matched_arms`), each next to its FLOP-model
prediction (`t2mlr.baselines.costs`): `t2mlr:S-E` (Jacobi at --d-forward / --d-backward), `looped:full:K`,
`looped:S-E:K`, `pause:P` (×P: P − 1 pause tokens after every real token; --seq counts real tokens),
`transformer`. Arms are built one at a time (two 135M models with AdamW state fit where six would not)
and timed in `--repeats` rounds against the Transformer, alternating which goes first; reported: median
step times and the median of per-round ratios. No memory column in this mode.

    python benchmarks/train_overhead.py                 # CPU, scaled down: 30 blocks, hidden 128, seq 256
    python benchmarks/train_overhead.py --gpu           # full SmolLM2-135M shape, seq 2048, bf16 autocast
    # trained checkpoint on CPU (recipe in configs/overhead_cpu.yaml):
    python benchmarks/train_overhead.py --checkpoint runs/overhead_cpu/checkpoints/step_00000400 \
        --data data/stdlib/eval.jsonl --tokenizer data/stdlib/tokenizer --tol 1e-2
    # the paper's looped and pause-token baselines, full SmolLM2-135M shape, CPU
    python benchmarks/train_overhead.py --hidden 576 --vocab 49152 --seq 256 --batch 1 --repeats 3 --warmup 1 \
        --models t2mlr:13-18,pause:2,looped:full:2,looped:9-22:3,transformer
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from t2mlr import T2MLRForCausalLM
from t2mlr.analysis.benchmarking import (
    machine_info,
    markdown_table,
    open_gates,
    text_rows,
)
from t2mlr.model.shapes import smollm2_shaped_config
from t2mlr.training.config import OptimConfig
from t2mlr.training.optim import build_optimizer

VARIANTS = ("transformer", "t2mlr-fixed", "t2mlr-tol")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="CUDA, full SmolLM2-135M shape, seq 2048, bf16 autocast")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=None, help="default: 576 with --gpu, else 128")
    p.add_argument("--seq", type=int, default=None, help="default: 2048 with --gpu, else 256")
    p.add_argument("--vocab", type=int, default=None, help="default: 49152 (SmolLM2) with --gpu, else 4096")
    p.add_argument("--batch", type=int, default=None, help="sequences per step; default: 8 with --gpu, else 2")
    p.add_argument("--l-start", type=int, default=13)
    p.add_argument("--l-end", type=int, default=18)
    p.add_argument("--d-forward", type=int, default=16)
    p.add_argument("--d-backward", type=int, default=4)
    p.add_argument("--tol", type=float, default=1e-3, help="jacobi_tol of the early-stopping variant")
    p.add_argument("--repeats", type=int, default=5, help="paired timing rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    p.add_argument("--activation-checkpointing", action="store_true", help="checkpoint the middle block")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="trained T²MLR directory (from_pretrained); sets shape and placement, keeps its gates")
    p.add_argument("--data", type=Path, default=None, help="jsonl text rows for the batch (default: random ids)")
    p.add_argument("--tokenizer", default=None, help="tokenizer of --data's text lines")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--models", default=None, help="compare these arms against the matched Transformer instead: "
                   "t2mlr:S-E, looped:full:K, looped:S-E:K, pause:P (×P), transformer; comma-separated")
    p.add_argument("--memory-child", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.hidden = args.hidden or (576 if args.gpu else 128)
    args.seq = args.seq or (2048 if args.gpu else 256)
    args.batch = args.batch or (8 if args.gpu else 2)
    args.vocab = args.vocab or (49152 if args.gpu else 4096)
    if args.checkpoint is not None:
        adopt_checkpoint_shape(args)
    if (args.data is None) != (args.tokenizer is None):
        p.error("--data and --tokenizer go together")
    if args.models is not None:
        from t2mlr.baselines.matching import parse_model_specs

        if args.checkpoint is not None:
            p.error("--models builds random models of the given shape; it does not take --checkpoint")
        try:
            args.models = parse_model_specs(args.models)
        except ValueError as err:
            p.error(str(err))
    return args


def adopt_checkpoint_shape(args: argparse.Namespace) -> None:
    """A trained checkpoint fixes the shape and the placement; the command line must not disagree silently."""
    from t2mlr import T2MLRConfig

    config = T2MLRConfig.from_pretrained(args.checkpoint)
    base = config.base_config
    args.layers, args.hidden, args.vocab = base.num_hidden_layers, base.hidden_size, base.vocab_size
    args.l_start, args.l_end = config.l_start, config.l_end


@dataclass
class Variant:
    name: str
    model: nn.Module
    kwargs: dict[str, Any]
    optimizer: torch.optim.Optimizer | None = None


def build_variant(name: str, args: argparse.Namespace, device: torch.device) -> Variant:
    """Every variant starts from the same weights (seeded, or the checkpoint's), so the comparison is like for like."""
    torch.manual_seed(0)
    model = T2MLRForCausalLM.from_pretrained(args.checkpoint) if args.checkpoint else random_t2mlr(args)
    if name == "transformer":
        model, kwargs = model.base_decoder(), {}
    else:
        model.model.set_middle_checkpointing(args.activation_checkpointing)
        kwargs = {"recurrence": "jacobi", "jacobi_tol": args.tol if name == "t2mlr-tol" else None,
                  "d_forward": args.d_forward, "d_backward": args.d_backward}
    model.to(device).train()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01))
    return Variant(name, model, kwargs, optimizer)


def base_shape(args: argparse.Namespace, positions: int | None = None) -> Any:
    """The base decoder config the command line describes (SmolLM2-135M's proportions), with room for
    `positions` positions (default: --seq)."""
    return smollm2_shaped_config(args.hidden, num_hidden_layers=args.layers, vocab_size=args.vocab,
                                 max_position_embeddings=max(8192, positions or args.seq))


def random_t2mlr(args: argparse.Namespace) -> T2MLRForCausalLM:
    """T²MLR around a freshly initialised base, gates opened (see the module docstring)."""
    from transformers import LlamaForCausalLM

    model = T2MLRForCausalLM.from_base(LlamaForCausalLM(base_shape(args)), args.l_start, args.l_end,
                                       d_forward=args.d_forward, d_backward=args.d_backward)
    return open_gates(model)


def make_batch(args: argparse.Namespace, device: torch.device) -> dict[str, torch.Tensor]:
    """Random token ids, or the first --batch packed rows of --data (positions restart per document)."""
    if args.data is not None:
        return {key: value.to(device) for key, value in text_rows(args.data, args.tokenizer, args.seq, args.batch).items()}
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


@dataclass
class StepResult:
    seconds: float
    loss: float
    jacobi_iterations: int | None


def train_step(variant: Variant, batch: dict[str, torch.Tensor], device: torch.device) -> StepResult:
    """Forward + backward + clip + AdamW, timed."""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    _sync(device)
    start = time.perf_counter()
    with autocast:
        out = variant.model(**batch, **variant.kwargs)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(variant.model.parameters(), 1.0)
    variant.optimizer.step()
    variant.optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return StepResult(time.perf_counter() - start, out.loss.item(), getattr(out, "jacobi_iterations", None))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_paired(variants: list[Variant], batch: dict[str, torch.Tensor], args: argparse.Namespace,
                device: torch.device) -> dict[str, Any]:
    """Median step times and ratios; also each variant's loss on its first step, taken from identical
    weights, so that early stopping's effect on the loss is visible next to its saving."""
    first_loss: dict[str, float] = {}
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    iterations: dict[str, list[int]] = {v.name: [] for v in variants}
    for variant in variants:
        for _ in range(args.warmup):
            first_loss.setdefault(variant.name, train_step(variant, batch, device).loss)
    for round_index in range(args.repeats):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            step = train_step(variant, batch, device)
            first_loss.setdefault(variant.name, step.loss)
            times[variant.name].append(step.seconds)
            if step.jacobi_iterations is not None:
                iterations[variant.name].append(step.jacobi_iterations)
    base = times["transformer"]
    result: dict[str, Any] = {}
    for name, values in times.items():
        ratios = [t / b for t, b in zip(values, base)]
        result[name] = {
            "median_step_s": statistics.median(values),
            "median_ratio_vs_transformer": statistics.median(ratios),
            "jacobi_iterations": statistics.mean(iterations[name]) if iterations[name] else None,
            "first_step_loss": first_loss[name],
        }
    return result


def resident_bytes(variant: Variant) -> int:
    """Weights + AdamW state (gradients are freed between steps)."""
    total = sum(p.numel() * p.element_size() for p in variant.model.parameters())
    for state in variant.optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))
    return total


def cuda_memory(variant: Variant, batch: dict[str, torch.Tensor], device: torch.device) -> int:
    """Peak bytes of one step above what is resident, plus this variant's resident bytes."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    train_step(variant, batch, device)
    return torch.cuda.max_memory_allocated(device) - before + resident_bytes(variant)


class RssSampler:
    """Samples this process's resident set size in a thread (torch releases the GIL inside ops)."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def current() -> int:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            time.sleep(self.interval_s)

    def __enter__(self) -> "RssSampler":
        self.peak = self.current()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


def cpu_memory_child(name: str, args: argparse.Namespace) -> None:
    """Runs in a fresh process: print sampled peak RSS of one (second) step above the RSS before it,
    plus the variant's resident weights and AdamW state. The parent sets MALLOC_MMAP_THRESHOLD_ so
    large tensors are mmapped and returned on free, which makes RSS follow live tensors."""
    device = torch.device("cpu")
    variant = build_variant(name, args, device)
    batch = make_batch(args, device)
    train_step(variant, batch, device)  # allocates the AdamW state
    before = RssSampler.current()
    with RssSampler() as sampler:
        train_step(variant, batch, device)
    print(json.dumps({"bytes": sampler.peak - before + resident_bytes(variant)}))


def cpu_memory(name: str, argv: list[str]) -> int:
    cmd = [sys.executable, __file__, *argv, "--memory-child", name]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["bytes"])


def arm_variant(name: str, config: Any, device: torch.device) -> Variant:
    """A seeded random model of an arm's config with AdamW, trained on the arm's own path (T²MLR: the
    config's Jacobi depths, passed explicitly)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    kwargs: dict[str, Any] = {}
    if isinstance(model, T2MLRForCausalLM):
        open_gates(model)
        kwargs = {"recurrence": "jacobi", "d_forward": config.d_forward, "d_backward": config.d_backward}
    model.to(device).train()
    return Variant(name, model, kwargs, build_optimizer(model, OptimConfig(lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01)))


def compare_models(args: argparse.Namespace, argv: list[str], device: torch.device) -> None:
    """`--models`: each arm's training step against the matched Transformer's, with the FLOP model's ratio."""
    from t2mlr.baselines.costs import train_step_flops
    from t2mlr.baselines.matching import ModelSpec, matched_arms

    info = machine_info(device)  # before the runs: the load average at start
    specs = [spec for spec in args.models if spec.kind != "transformer"]
    longest = args.seq * max(spec.period or 1 for spec in specs)  # a ×P pause model runs P positions per token
    target, arms = matched_arms(base_shape(args, longest), [*specs, ModelSpec("transformer")],
                                d_forward=args.d_forward, d_backward=args.d_backward)
    reference = arms[-1]
    transformer = arm_variant("transformer", reference.config, device)
    batch = make_batch(args, device)
    print(f"device {device}; {args.layers} blocks, T²MLR hidden {args.hidden} ({target:,} parameters), matched "
          f"Transformer hidden {reference.hidden_size} ({reference.parameters:,}); seq {args.seq}, batch {args.batch}; "
          f"T²MLR Jacobi d_forward {args.d_forward}, d_backward {args.d_backward}; fp32", flush=True)
    rows = []
    for arm in arms[:-1]:
        variant = arm_variant(arm.spec.name, arm.config, device)
        timing = time_paired([transformer, variant], batch, args, device)
        ratio = timing[variant.name]["median_ratio_vs_transformer"]
        predicted = train_step_flops(arm.config, args.seq) / train_step_flops(reference.config, args.seq)
        print(f"  {arm.spec.name}: ratio {ratio:.3f}, FLOP model {predicted:.3f}", flush=True)
        rows.append([arm.spec.label, arm.hidden_size, f"{arm.parameters:,}",
                     f"{timing[variant.name]['median_step_s']:.3f}", f"{timing['transformer']['median_step_s']:.3f}",
                     f"{ratio:.2f}×", f"{predicted:.2f}×"])
        del variant
    print(f"\n### Training step vs the parameter-matched Transformer (forward + backward + clip + AdamW, median of "
          f"{args.repeats} paired rounds after {args.warmup} warm-up; FLOP ratio from t2mlr.baselines.costs)\n")
    print("\n".join(f"- {key}: {value}" for key, value in info.items()))
    print(f"- command: python benchmarks/train_overhead.py {' '.join(argv)}\n")
    print(markdown_table(["model", "hidden", "parameters", "step s", "Transformer step s", "time ratio",
                          "FLOP ratio"], rows))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.models is not None:
        compare_models(args, argv, torch.device("cuda") if args.gpu else torch.device("cpu"))
        return
    if args.memory_child:
        cpu_memory_child(args.memory_child, args)
        return
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu given but CUDA is not available")
    device = torch.device("cuda") if args.gpu else torch.device("cpu")
    print(f"device {device}; {args.layers} blocks, hidden {args.hidden}, seq {args.seq}, batch {args.batch}; "
          f"T²MLR({args.l_start},{args.l_end}) d_forward {args.d_forward}, d_backward {args.d_backward}, "
          f"early-stop tol {args.tol}; activation checkpointing {args.activation_checkpointing}; "
          f"{'bf16 autocast' if args.gpu else 'fp32'}; "
          + (f"trained checkpoint {args.checkpoint}" if args.checkpoint else "gates set to γ_cur=-0.5, γ_rec=0.5")
          + f"; batch {'from ' + str(args.data) if args.data else 'of random ids'}")
    variants = [build_variant(name, args, device) for name in VARIANTS]
    batch = make_batch(args, device)
    timing = time_paired(variants, batch, args, device)
    if device.type == "cuda":
        memory = {v.name: cuda_memory(v, batch, device) for v in variants}
        memory_kind = "CUDA max_memory_allocated in a step + resident weights/AdamW state"
    else:
        del variants
        memory = {name: cpu_memory(name, _without_json(argv)) for name in VARIANTS}
        memory_kind = ("CPU: sampled peak RSS of a step above the RSS before it + resident weights/AdamW state, "
                       "fresh subprocess per variant (coarser than CUDA's counter)")
    report(timing, memory, memory_kind, args)


def _without_json(argv: list[str]) -> list[str]:
    """The child processes get the same shape arguments but must not write the report."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif not arg.startswith("--json="):
            out.append(arg)
    return out


def report(timing: dict[str, Any], memory: dict[str, int], memory_kind: str, args: argparse.Namespace) -> None:
    print(f"\n{'variant':<14}{'median step (s)':>17}{'ratio (median of pairs)':>26}{'jacobi its':>12}"
          f"{'first loss':>12}{'memory (MiB)':>14}{'mem ratio':>11}")
    for name in VARIANTS:
        t = timing[name]
        its = "-" if t["jacobi_iterations"] is None else f"{t['jacobi_iterations']:.1f}"
        mem_ratio = memory[name] / memory["transformer"] if memory["transformer"] > 0 else float("nan")
        print(f"{name:<14}{t['median_step_s']:>17.4f}{t['median_ratio_vs_transformer']:>26.2f}{its:>12}"
              f"{t['first_step_loss']:>12.4f}{memory[name] / 2**20:>14.1f}{mem_ratio:>11.2f}")
    print(f"memory measure: {memory_kind}")
    fixed = timing["t2mlr-fixed"]["median_ratio_vs_transformer"]
    verdict = "within" if fixed <= 2.24 else "above"
    print(f"fixed-depth step-time ratio {fixed:.2f}× is {verdict} the 2.24× target (paper, (13,18), d_forward 16)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "timing": timing,
                                         "memory_bytes": memory, "memory_kind": memory_kind}, indent=2))


if __name__ == "__main__":
    main()
