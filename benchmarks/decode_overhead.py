"""Decoding overhead of T²MLR over the parameter-matched Transformer (paper, "Inference Overhead").

Both models generate greedily from the BOS token through `generate()` (min_new_tokens =
max_new_tokens, so every run produces exactly the requested number of tokens) in one process. The
baseline is the same backbone widened until its parameter count is at least T²MLR's, with the head
count and head dimension kept (SmolLM2-135M: hidden 576 → 584, 9 heads of 64; docs/semantics.md §8,
`t2mlr.baselines.matching`). T²MLR adds 5d² + 3d + 2 parameters whatever the placement, so one
baseline serves every placement.

Timing: for each placement and length, `--repeats` pairs of runs alternating which model goes first;
reported: median seconds per run of each, and the median of the per-pair time ratios (T²MLR /
baseline). Weights are random (speed does not depend on them); T²MLR's gates are set to
γ_cur = -0.5, γ_rec = 0.5 so the fusion is not at its identity point (it costs the same either way).

Defaults: on CUDA the paper's lengths 512, 1024, 2048 in bfloat16; on CPU 64, 128, 256 in float32
and one torch thread (2048 tokens of a 135M model take minutes per run on a CPU; the per-token overhead
is what is compared; one thread because more spin-wait against other load, see t2mlr.analysis.benchmarking),
three placements, three pairs: about 8.5 minutes.

`--cache static` decodes both models with preallocated caches (T²MLR: `T2MLRStaticCache`, R included; the
Transformer: `StaticCache`), and `--compile MODE` compiles both decode steps the same way
(`torch.compile(fullgraph=True)`; `reduce-overhead` captures CUDA graphs). A static cache is sized for the
longest length in every run (generate(max_cache_len=...)), so each model's step has one shape: it is
compiled and captured once, in untimed warm-up runs. `--plain` also times T²MLR against its own base model
(the same weights without the recurrence, `base_decoder()`), where issue 45's target is ≤ 1.03×; the matched
Transformer is wider. `--profile` adds, after the table, torch.profiler's summary of one run of each model at the first length (where the time goes).

`--models` compares any arms side by side instead, each against the parameter-matched Transformer and
each next to its FLOP-model prediction (`t2mlr.baselines.costs`): `t2mlr:S-E` (T²MLR at the base width),
`looped:full:K` / `looped:S-E:K` (blocks looped K times), `pause:P` (the ×P pause-token model: P − 1
pause tokens after every real token), `transformer` (the reference, always measured). Every baseline
gets the width matched to T²MLR (`t2mlr.baselines.matching.matched_arms`; 584 at the 135M shape). For
each arm and length: `--repeats` pairs of runs against the Transformer, alternating which goes first;
reported: each one's median ms/token and the median of the per-pair ratios.

    python benchmarks/decode_overhead.py                       # CPU defaults
    python benchmarks/decode_overhead.py --quick               # < 1 minute: (5,26), 32 tokens, 3 pairs
    python benchmarks/decode_overhead.py --device cuda         # GPU: 512/1024/2048 tokens, bf16
    python benchmarks/decode_overhead.py --lengths 512 --placements 9-22 --repeats 5 --threads 2   # idle machine
    python benchmarks/decode_overhead.py --device cuda --cache static --compile reduce-overhead   # CUDA graphs
    python benchmarks/decode_overhead.py --device cuda --cache static --compile reduce-overhead --plain \
        --placements 13-18 --lengths 512,2048                  # benchmarks/gpu/run.sh A
    python benchmarks/decode_overhead.py --models t2mlr:13-18,t2mlr:9-22,pause:2,looped:full:2,looped:9-22:3,transformer \
        --lengths 32,128                                       # the paper's looped and pause-token baselines
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from t2mlr import T2MLRConfig, T2MLRForCausalLM
from t2mlr.utils import parse_int_list
from t2mlr.analysis.benchmarking import (
    machine_info,
    median_ratio,
    open_gates,
    paired_times,
    parse_placements,
    print_report,
    profile_table,
)
from t2mlr.baselines.costs import decode_flops
from t2mlr.baselines.matching import (
    Arm,
    count_parameters,
    matched_arms,
    matched_baseline_config,
    parse_model_specs,
)
from t2mlr.generation.text import COMPILE_MODES, compiled_decoding_kwargs
from t2mlr.model.shapes import smollm2_shaped_config
from t2mlr.utils import DTYPES, resolve_device, resolve_dtype

PAPER_PLACEMENTS = "1-30,5-26,9-22"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--lengths", default=None, help="new tokens per run (default: 512,1024,2048 on CUDA, 64,128,256 on CPU)")
    p.add_argument("--repeats", type=int, default=3, help="pairs of runs per setting")
    p.add_argument("--placements", default=PAPER_PLACEMENTS, help="l_start-l_end pairs, 1-based (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=576, help="model width; 576 is SmolLM2-135M (default), other "
                   "widths keep its proportions")
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU, see the docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: placement 5-26, 32 tokens, 3 pairs")
    p.add_argument("--models", default=None, help="compare these arms instead of --placements: t2mlr:S-E, "
                   "looped:full:K, looped:S-E:K, pause:P (×P: P − 1 pauses per token), transformer; comma-separated")
    p.add_argument("--cache", default="dynamic", choices=("dynamic", "static"),
                   help="dynamic (T2MLRCache / DynamicCache, the default) or static (T2MLRStaticCache / StaticCache)")
    p.add_argument("--compile", default="off", choices=COMPILE_MODES,
                   help="torch.compile mode of both decode steps (needs --cache static; reduce-overhead: CUDA graphs)")
    p.add_argument("--plain", action="store_true",
                   help="also time T²MLR against its own base model (same weights, no recurrence)")
    p.add_argument("--profile", action="store_true",
                   help="also print torch.profiler's operator summary of one run of each model (first length)")
    args = p.parse_args(argv)
    if args.compile != "off" and args.cache != "static":
        p.error("--compile needs --cache static (a growing cache changes the step's shapes every token)")
    if args.cache == "static" and args.models is not None:
        p.error("--cache static compares T²MLR with the Transformer (--placements); the looped and pause-token "
                "baselines keep their own caches")
    args.device = resolve_device(args.device)
    cuda = args.device.type == "cuda"
    if args.quick:
        args.placements, args.lengths, args.repeats = "5-26", args.lengths or "32", 3
    args.lengths = parse_int_list(args.lengths or ("512,1024,2048" if cuda else "64,128,256"))
    args.placements = parse_placements(args.placements)
    try:
        args.models = None if args.models is None else parse_model_specs(args.models)
    except ValueError as err:
        p.error(str(err))
    args.dtype = resolve_dtype(args.dtype or ("bfloat16" if cuda else "float32"))
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def build_t2mlr(placement: tuple[int, int], args: argparse.Namespace) -> T2MLRForCausalLM:
    return build_from_config(T2MLRConfig.from_base(smollm2_shaped_config(args.hidden), *placement), args)


def build_from_config(config: object, args: argparse.Namespace) -> PreTrainedModel:
    """A seeded random model of any registered config; T²MLR's gates opened (see the module docstring)."""
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    if isinstance(model, T2MLRForCausalLM):
        open_gates(model)
    return model.to(device=args.device, dtype=args.dtype).eval()


def build_baseline(t2mlr_params: int, args: argparse.Namespace) -> PreTrainedModel:
    torch.manual_seed(args.seed)
    config = matched_baseline_config(smollm2_shaped_config(args.hidden), t2mlr_params)
    return AutoModelForCausalLM.from_config(config).to(device=args.device, dtype=args.dtype).eval()


def decoding_settings(args: argparse.Namespace) -> dict[str, object]:
    """generate() arguments of `--cache` and `--compile`, the same for T²MLR and the Transformer. A static
    cache holds the longest run (BOS + the longest length) in every run: the step's shapes never change,
    so it is compiled and captured once per model."""
    if args.cache == "dynamic":
        return {}
    return {**compiled_decoding_kwargs(args.compile), "max_cache_len": max(args.lengths) + 1}


def greedy_run(model: PreTrainedModel, new_tokens: int, device: torch.device,
               settings: dict[str, object] | None = None) -> Callable[[], torch.Tensor]:
    """A closure generating exactly `new_tokens` tokens greedily from BOS (`settings`: `decoding_settings`)."""
    bos = torch.tensor([[model.config.bos_token_id]], device=device)
    extra = {"prefill": "exact"} if isinstance(model, T2MLRForCausalLM) else {}
    extra.update(settings or {})

    def run() -> torch.Tensor:
        with torch.no_grad():
            out = model.generate(
                input_ids=bos,
                attention_mask=torch.ones_like(bos),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
                **extra,
            )
        if out.shape[1] != new_tokens + 1:
            raise RuntimeError(f"generated {out.shape[1] - 1} tokens instead of {new_tokens}")
        return out

    return run


def measure_pairs(
    name: str, model: PreTrainedModel, baseline: PreTrainedModel, length: int, args: argparse.Namespace
) -> tuple[list[float], list[float], float]:
    """`--repeats` paired generation times of `model` and the baseline, and the median per-pair ratio."""
    settings = decoding_settings(args)
    runs = greedy_run(model, length, args.device, settings), greedy_run(baseline, length, args.device, settings)
    ours, base = paired_times(*runs, args.repeats, args.device)
    ratio = median_ratio(ours, base)
    print(f"  {name} {length:5d} tokens: ratio {ratio:.3f} (pairs: "
          + ", ".join(f"{o / b:.3f}" for o, b in zip(ours, base)) + ")", flush=True)
    return ours, base, ratio


def warm_up(*models: PreTrainedModel, device: torch.device, settings: dict[str, object] | None = None) -> None:
    """Lazy initialisation, allocator, kernel selection, and with --compile the compilation and CUDA-graph
    capture of the step's one shape: short generations of each model before timing."""
    for model in models:
        start = time.perf_counter()
        for _ in range(2 if settings and "compile_config" in settings else 1):
            greedy_run(model, 8, device, settings)()
        print(f"  warm-up of {type(model).__name__}: {time.perf_counter() - start:.1f} s", flush=True)


def measure_placement(
    placement: tuple[int, int], baseline: PreTrainedModel, args: argparse.Namespace
) -> list[list[object]]:
    """Table rows (one per reference and length) for one placement: against its own base model first
    (--plain), then against the matched Transformer."""
    model = build_t2mlr(placement, args)
    references = [("plain base", model.base_decoder().eval())] if args.plain else []
    references.append(("matched Transformer", baseline))
    warm_up(model, *(reference for _, reference in references), device=args.device, settings=decoding_settings(args))
    rows = []
    for (name, reference), length in itertools.product(references, args.lengths):
        ours, base, ratio = measure_pairs(f"{placement} vs {name}", model, reference, length, args)
        rows.append(
            [
                f"T²MLR{placement}",
                name,
                length,
                f"{statistics.median(ours):.2f}",
                f"{statistics.median(base):.2f}",
                f"{1000 * statistics.median(ours) / length:.2f}",
                f"{1000 * statistics.median(base) / length:.2f}",
                f"{ratio:.3f}×",
            ]
        )
    del model
    return rows


def print_profiles(placement: tuple[int, int], baseline: PreTrainedModel, args: argparse.Namespace) -> None:
    """Operator summaries of one generation of T²MLR and of the baseline at the first length."""
    model, length, settings = build_t2mlr(placement, args), args.lengths[0], decoding_settings(args)
    for name, which in ((f"T²MLR{placement}", model), ("Transformer (matched)", baseline)):
        run = greedy_run(which, length, args.device, settings)
        run()  # warm: compilation and capture are not what the profile is for
        print(f"\n### Profile: {name}, {length} new tokens\n\n```\n{profile_table(run, args.device)}\n```", flush=True)


def measure_arm(arm: Arm, baseline: PreTrainedModel, reference: Arm, args: argparse.Namespace) -> list[list[object]]:
    """Table rows (one per length) for one arm of `--models`, each with the FLOP model's prediction."""
    model = build_from_config(arm.config, args)
    warm_up(model, baseline, device=args.device)
    rows = []
    for length in args.lengths:
        ours, base, ratio = measure_pairs(arm.spec.name, model, baseline, length, args)
        predicted = decode_flops(arm.config, length) / decode_flops(reference.config, length)
        rows.append([
            arm.spec.label, arm.hidden_size, f"{arm.parameters:,}", length,
            f"{1000 * statistics.median(ours) / length:.1f}", f"{1000 * statistics.median(base) / length:.1f}",
            f"{ratio:.3f}×", f"{predicted:.3f}×",
        ])
    del model
    return rows


def compare_models(args: argparse.Namespace, info: dict[str, str], argv: list[str] | None) -> None:
    """`--models`: every arm against the parameter-matched Transformer, with the FLOP model beside it."""
    from t2mlr.baselines.matching import ModelSpec

    specs = [spec for spec in args.models if spec.kind != "transformer"]
    target, arms = matched_arms(smollm2_shaped_config(args.hidden), [*specs, ModelSpec("transformer")])
    reference = arms[-1]
    baseline = build_from_config(reference.config, args)
    print(f"SmolLM2-135M {'shape' if args.hidden == 576 else f'proportions at hidden {args.hidden}'}; T²MLR "
          f"parameters {target:,}; matched Transformer: hidden {reference.hidden_size}, {reference.parameters:,} "
          "parameters", flush=True)
    rows = []
    for arm in arms[:-1]:
        rows += measure_arm(arm, baseline, reference, args)
    headers = ["model", "hidden", "parameters", "new tokens", "ms/token", "Transformer ms/token",
               "time ratio", "FLOP ratio"]
    title = (f"Decoding cost vs the parameter-matched Transformer ({str(args.dtype).removeprefix('torch.')}, "
             f"greedy from BOS, median of {args.repeats} paired runs; FLOP ratio from t2mlr.baselines.costs)")
    print_report(title, info, "decode_overhead.py", argv, headers, rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None or args.device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    info = machine_info(args.device)
    if args.models is not None:
        compare_models(args, info, argv)
        return
    with torch.device("meta"):  # parameter count without allocating weights (same for every placement)
        reference = T2MLRForCausalLM(T2MLRConfig.from_base(smollm2_shaped_config(args.hidden), *args.placements[0]))
    t2mlr_params = count_parameters(reference)
    baseline = build_baseline(t2mlr_params, args)
    print(
        f"SmolLM2-135M {'shape' if args.hidden == 576 else f'proportions at hidden {args.hidden}'}; T²MLR parameters {t2mlr_params:,}; matched Transformer: hidden "
        f"{baseline.config.hidden_size}, head_dim {baseline.config.head_dim}, {count_parameters(baseline):,} parameters",
        flush=True,
    )
    rows = []
    for placement in args.placements:
        rows += measure_placement(placement, baseline, args)
    if args.profile:
        print_profiles(args.placements[0], baseline, args)
    headers = ["model", "against", "new tokens", "T²MLR s", "baseline s", "T²MLR ms/token", "baseline ms/token",
               "time ratio"]
    title = (f"Decoding overhead vs the parameter-matched Transformer ({str(args.dtype).removeprefix('torch.')}, "
             f"greedy from BOS, {args.cache} cache, compile {args.compile}, median of {args.repeats} paired runs)")
    print_report(title, info, "decode_overhead.py", argv, headers, rows)


if __name__ == "__main__":
    main()
