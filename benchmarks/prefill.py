"""Jacobi vs exact prefill of T²MLR (paper, "Prefill"): speed-up over exact, and deviation from exact.

A prefill is the forward over the prompt with a fresh `T2MLRCache` (use_cache=True, logits of the last
position only, as `generate()` runs it). Exact runs the recurrent middle block token by token; Jacobi
runs it over the whole prompt d_forward + 1 times in parallel (docs/semantics.md §5.2). Reported per depth: the
median over repeats of exact time / Jacobi time (each repeat times exact and every depth back to back,
in a rotated order), the largest |logit difference| from exact at the last prompt position, and the
largest |difference| of the recurrent state handed to decoding. `--tols` adds variants at the largest
depth that stop the iterations once the cache moves by at most the tolerance (generate(prefill_tol=...)),
with the number of iterations they ran.

Weights are random (SmolLM2-135M shape, the model's own initialisation) with the gates opened to
γ_cur = -0.5, γ_rec = 0.5 (the signs trained models end with, docs/semantics.md §6): at γ = 0 every depth would be
exact and the deviation column meaningless. How much the recurrence matters at all is printed as the
largest |logit difference| between the exact path and the path without recurrence ("off").
--fusion-scale multiplies the random fusion weights: larger values make the recurrence stronger and
the Jacobi iteration slower to converge (around 10 it stops contracting within 32 iterations).
Deviations of a trained model differ; the timing does not depend on the weights. `--checkpoint DIR`
measures a trained T²MLR instead (its own shape, placement and gates) on a prompt of real text: the
first single-document row of --prompt-length tokens of `--data` (jsonl of {"text"} lines, tokenized
with `--tokenizer`), e.g. the checkpoint of configs/overhead_cpu.yaml.

Width: `--hidden 576` (the default) is the SmolLM2-135M shape; other widths keep its proportions
(30 blocks, heads of 64, 3:1 GQA where possible, MLP 8/3 × hidden). The speed-up depends on the
regime more than on the code: an exact step is one token through the middle block, bound by latency
(kernel launches, Python, on a GPU and for narrow models) or by reading the weights (wide models on a
CPU), while a Jacobi pass over the prompt is one large batched computation. A sweep over widths
shows where a machine crosses from one regime to the other.

CPU: one torch thread by default (t2mlr.analysis.benchmarking says why); about 6.5 minutes at hidden 576.

    python benchmarks/prefill.py                    # CPU: T²MLR(5,26), 512-token prompt, depths 2..32
    python benchmarks/prefill.py --hidden 64,128,256,576 --depths 8,16
    python benchmarks/prefill.py --checkpoint runs/overhead_cpu/checkpoints/step_00000400 \
        --data data/stdlib/eval.jsonl --tokenizer data/stdlib/tokenizer --prompt-length 256 --tols 1e-4
    python benchmarks/prefill.py --quick            # < 1 minute: 128-token prompt, depths 2,4,8
    python benchmarks/prefill.py --device cuda --placements 5-26,9-22,13-18,15-16
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from t2mlr import T2MLRCache, T2MLRConfig, T2MLRForCausalLM
from t2mlr.utils import parse_int_list
from t2mlr.analysis.benchmarking import (
    machine_info,
    parse_placements,
    print_report,
    text_rows,
    timed,
)
from t2mlr.model.shapes import smollm2_shaped_config
from t2mlr.utils import DTYPES, resolve_device, resolve_dtype


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--prompt-length", type=int, default=512)
    p.add_argument("--depths", default="2,4,8,16,32", help="Jacobi d_forward values (default: %(default)s)")
    p.add_argument("--placements", default="5-26", help="l_start-l_end pairs, 1-based (default: %(default)s)")
    p.add_argument("--hidden", default="576", help="model widths, SmolLM2-135M proportions (default: %(default)s)")
    p.add_argument("--tols", default="", help="jacobi_tol values, each a variant at the largest depth (e.g. 1e-4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--fusion-scale", type=float, default=1.0, help="multiplies the random fusion weights")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU, see the docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="trained T²MLR directory (from_pretrained) instead of random weights")
    p.add_argument("--data", type=Path, default=None, help="with --checkpoint: jsonl of text lines for the prompt")
    p.add_argument("--tokenizer", default=None, help="with --checkpoint: the tokenizer of --data")
    p.add_argument("--quick", action="store_true", help="smoke run: 128-token prompt, depths 2,4,8, 2 repeats")
    args = p.parse_args(argv)
    args.device = resolve_device(args.device)
    if args.quick:
        args.prompt_length, args.depths, args.repeats = 128, "2,4,8", 2
    args.depths = parse_int_list(args.depths)
    args.tols = [float(t) for t in args.tols.split(",") if t.strip()]
    args.placements = parse_placements(args.placements)
    args.hidden = parse_int_list(args.hidden)
    args.dtype = resolve_dtype(args.dtype or ("bfloat16" if args.device.type == "cuda" else "float32"))
    if args.repeats < 1 or args.prompt_length < 2:
        p.error("need --repeats >= 1 and --prompt-length >= 2")
    if args.checkpoint and (args.data is None or args.tokenizer is None):
        p.error("--checkpoint needs --data and --tokenizer (a trained model is measured on real text)")
    return args


def load_trained(args: argparse.Namespace) -> T2MLRForCausalLM:
    model = T2MLRForCausalLM.from_pretrained(args.checkpoint)
    return model.to(device=args.device, dtype=args.dtype).eval()


def text_prompt(args: argparse.Namespace) -> torch.Tensor:
    """The first row of --data that lies within one document (positions 0..T-1)."""
    rows = text_rows(args.data, args.tokenizer, args.prompt_length)
    whole = (rows["position_ids"][:, -1] == args.prompt_length - 1).nonzero()
    if whole.numel() == 0:
        raise SystemExit(f"no document in {args.data} has {args.prompt_length} tokens: use a shorter --prompt-length")
    return rows["input_ids"][int(whole[0, 0])][None].to(args.device)


def build_model(placement: tuple[int, int], hidden: int, args: argparse.Namespace) -> T2MLRForCausalLM:
    torch.manual_seed(args.seed)
    model = T2MLRForCausalLM(T2MLRConfig.from_base(smollm2_shaped_config(hidden), *placement))
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(-0.5)
        model.fusion.gamma_rec.fill_(0.5)
        for linear in (model.fusion.f_cur, model.fusion.f_rec, model.fusion.w_rec):
            linear.weight.mul_(args.fusion_scale)
    return model.to(device=args.device, dtype=args.dtype).eval()


@dataclass(frozen=True)
class Prefill:
    """One way to prefill: exact (depth None), or Jacobi at a depth, optionally stopping at a tolerance."""

    depth: int | None = None
    tol: float | None = None

    @property
    def label(self) -> str:
        if self.depth is None:
            return "exact"
        return f"jacobi d={self.depth}" + ("" if self.tol is None else f" tol {self.tol:g}")


def prefill(model: T2MLRForCausalLM, prompt: torch.Tensor, how: Prefill) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """Last-position logits, the recurrent state handed to decoding, and the Jacobi iterations run."""
    path = ({"recurrence": "exact"} if how.depth is None else
            {"recurrence": "jacobi", "d_forward": how.depth, "d_backward": 1, "jacobi_tol": how.tol})
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        out = model(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache, use_cache=True,
                    logits_to_keep=1, **path)
    return out.logits[:, -1].float(), cache.recurrent_state.float(), out.jacobi_iterations


def random_prompt(model: T2MLRForCausalLM, args: argparse.Namespace) -> torch.Tensor:
    generator = torch.Generator().manual_seed(args.seed)
    return torch.randint(1, model.config.vocab_size, (1, args.prompt_length), generator=generator).to(args.device)


def measure(model: T2MLRForCausalLM, prompt: torch.Tensor, name: str, args: argparse.Namespace) -> list[list[object]]:
    exact = Prefill()
    variants = [exact, *(Prefill(d) for d in args.depths), *(Prefill(max(args.depths), t) for t in args.tols)]
    prefill(model, prompt[:, :16], exact)  # warm-up of both paths
    prefill(model, prompt[:, :16], Prefill(2))
    times: dict[Prefill, list[float]] = {v: [] for v in variants}
    outputs: dict[Prefill, tuple[torch.Tensor, torch.Tensor, int | None]] = {}
    for r in range(args.repeats):
        shift = r % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            times[variant].append(timed(lambda: outputs.__setitem__(variant, prefill(model, prompt, variant)), args.device))
        print(f"  {name} repeat {r + 1}: " + ", ".join(f"{v.label} {times[v][-1]:.2f}s" for v in variants), flush=True)
    exact_logits, exact_state, _ = outputs[exact]
    rows = [[name, "exact", f"{statistics.median(times[exact]):.2f}", "1.0×", "-", "0", "0"]]
    for variant in variants[1:]:
        speedup = statistics.median(e / j for e, j in zip(times[exact], times[variant]))
        logits, state, iterations = outputs[variant]
        rows.append(
            [
                name,
                variant.label,
                f"{statistics.median(times[variant]):.2f}",
                f"{speedup:.1f}×",
                iterations,
                f"{(logits - exact_logits).abs().max():.2e}",
                f"{(state - exact_state).abs().max():.2e}",
            ]
        )
    with torch.no_grad():
        off = model(prompt, recurrence="off", logits_to_keep=1).logits[:, -1].float()
    effect = float((exact_logits - off).abs().max())
    rows.insert(1, [name, "off (no recurrence)", "-", "-", "-", f"{effect:.2e}", "-"])
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None or args.device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    info = machine_info(args.device)
    rows = []
    if args.checkpoint:
        model = load_trained(args)
        config = model.config
        name = f"trained T²MLR({config.l_start}, {config.l_end}), hidden {config.hidden_size}"
        rows += measure(model, text_prompt(args), name, args)
    for hidden in [] if args.checkpoint else args.hidden:
        for placement in args.placements:
            model = build_model(placement, hidden, args)
            rows += measure(model, random_prompt(model, args), f"T²MLR{placement}, hidden {hidden}", args)
    headers = ["model", "prefill", "seconds", "speed-up vs exact", "Jacobi iterations", "max |Δ logit| (last pos.)",
               "max |Δ R| handed over"]
    weights = (f"trained checkpoint {args.checkpoint}, prompt from {args.data}" if args.checkpoint
               else f"random weights, gates opened, fusion-scale {args.fusion_scale:g}")
    title = (f"Jacobi vs exact prefill ({args.prompt_length}-token prompt, {str(args.dtype).removeprefix('torch.')}, "
             f"median of {args.repeats} repeats; {weights})")
    print_report(title, info, "prefill.py", argv, headers, rows)

if __name__ == "__main__":
    main()
