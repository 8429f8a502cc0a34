"""Jacobi vs exact prefill of T²MLR (paper, "Prefill"): speed-up over exact, and deviation from exact.

A prefill is the forward over the prompt with a fresh `T2MLRCache` (use_cache=True, logits of the last
position only, as `generate()` runs it). Exact runs the recurrent middle block token by token; Jacobi
runs it over the whole prompt d_forward + 1 times in parallel (SPEC §5.2). Reported per depth: the
median over repeats of exact time / Jacobi time (each repeat times exact and every depth back to back,
in a rotated order), the largest |logit difference| from exact at the last prompt position, and the
largest |difference| of the recurrent state handed to decoding.

Weights are random (SmolLM2-135M shape, the model's own initialisation) with the gates opened to
γ_cur = -0.5, γ_rec = 0.5 (the signs trained models end with, SPEC §6): at γ = 0 every depth would be
exact and the deviation column meaningless. How much the recurrence matters at all is printed as the
largest |logit difference| between the exact path and the path without recurrence ("off").
--fusion-scale multiplies the random fusion weights: larger values make the recurrence stronger and
the Jacobi iteration slower to converge (around 10 it stops contracting within 32 iterations).
Deviations of a trained model differ; the timing does not depend on the weights.

CPU: one torch thread by default (benchmarks/_timing.py says why); about 6.5 minutes.

    python benchmarks/prefill.py                    # CPU: T²MLR(5,26), 512-token prompt, depths 2..32
    python benchmarks/prefill.py --quick            # < 1 minute: 128-token prompt, depths 2,4,8
    python benchmarks/prefill.py --device cuda --placements 5-26,9-22,13-18,15-16
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import (  # noqa: E402
    DTYPES,
    info_lines,
    machine_info,
    markdown_table,
    parse_int_list,
    parse_placements,
    resolve_device,
    smollm2_135m_config,
    timed,
)

from t2mlr import T2MLRCache, T2MLRConfig, T2MLRForCausalLM  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--prompt-length", type=int, default=512)
    p.add_argument("--depths", default="2,4,8,16,32", help="Jacobi d_forward values (default: %(default)s)")
    p.add_argument("--placements", default="5-26", help="l_start-l_end pairs, 1-based (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--fusion-scale", type=float, default=1.0, help="multiplies the random fusion weights")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU, see the docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 128-token prompt, depths 2,4,8, 2 repeats")
    args = p.parse_args(argv)
    args.device = resolve_device(args.device)
    if args.quick:
        args.prompt_length, args.depths, args.repeats = 128, "2,4,8", 2
    args.depths = parse_int_list(args.depths)
    args.placements = parse_placements(args.placements)
    args.dtype = DTYPES[args.dtype or ("bfloat16" if args.device.type == "cuda" else "float32")]
    if args.repeats < 1 or args.prompt_length < 2:
        p.error("need --repeats >= 1 and --prompt-length >= 2")
    return args


def build_model(placement: tuple[int, int], args: argparse.Namespace) -> T2MLRForCausalLM:
    torch.manual_seed(args.seed)
    model = T2MLRForCausalLM(T2MLRConfig.from_base(smollm2_135m_config(), *placement))
    with torch.no_grad():
        model.fusion.gamma_cur.fill_(-0.5)
        model.fusion.gamma_rec.fill_(0.5)
        for linear in (model.fusion.f_cur, model.fusion.f_rec, model.fusion.w_rec):
            linear.weight.mul_(args.fusion_scale)
    return model.to(device=args.device, dtype=args.dtype).eval()


def prefill(model: T2MLRForCausalLM, prompt: torch.Tensor, depth: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-position logits and the recurrent state handed to decoding; depth None = exact."""
    path = {"recurrence": "exact"} if depth is None else {"recurrence": "jacobi", "d_forward": depth, "d_backward": 1}
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        out = model(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache, use_cache=True,
                    logits_to_keep=1, **path)
    return out.logits[:, -1].float(), cache.recurrent_state.float()


def measure_placement(placement: tuple[int, int], args: argparse.Namespace) -> list[list[object]]:
    model = build_model(placement, args)
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(1, model.config.vocab_size, (1, args.prompt_length), generator=generator).to(args.device)
    variants: list[int | None] = [None, *args.depths]
    prefill(model, prompt[:, :16], None)  # warm-up of both paths
    prefill(model, prompt[:, :16], 2)
    times: dict[int | None, list[float]] = {v: [] for v in variants}
    outputs: dict[int | None, tuple[torch.Tensor, torch.Tensor]] = {}
    for r in range(args.repeats):
        shift = r % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            times[variant].append(timed(lambda: outputs.__setitem__(variant, prefill(model, prompt, variant)), args.device))
        print(f"  {placement} repeat {r + 1}: exact {times[None][-1]:.2f}s, "
              + ", ".join(f"d={d} {times[d][-1]:.2f}s" for d in args.depths), flush=True)
    exact_logits, exact_state = outputs[None]
    rows = [[f"T²MLR{placement}", "exact", f"{statistics.median(times[None]):.2f}", "1.0×", "0", "0"]]
    for depth in args.depths:
        speedup = statistics.median(e / j for e, j in zip(times[None], times[depth]))
        logits, state = outputs[depth]
        rows.append(
            [
                f"T²MLR{placement}",
                f"jacobi d={depth}",
                f"{statistics.median(times[depth]):.2f}",
                f"{speedup:.1f}×",
                f"{(logits - exact_logits).abs().max():.2e}",
                f"{(state - exact_state).abs().max():.2e}",
            ]
        )
    with torch.no_grad():
        off = model(prompt, recurrence="off", logits_to_keep=1).logits[:, -1].float()
    effect = float((exact_logits - off).abs().max())
    rows.insert(1, [f"T²MLR{placement}", "off (no recurrence)", "-", "-", f"{effect:.2e}", "-"])
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None or args.device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    info = machine_info(args.device)
    rows = []
    for placement in args.placements:
        rows += measure_placement(placement, args)
    headers = ["model", "prefill", "seconds", "speed-up vs exact", "max |Δ logit| (last pos.)", "max |Δ R| handed over"]
    print()
    print(f"### Jacobi vs exact prefill ({args.prompt_length}-token prompt, {str(args.dtype).removeprefix('torch.')}, "
          f"median of {args.repeats} repeats; random weights, gates opened, fusion-scale {args.fusion_scale:g})\n")
    print(info_lines(info))
    print(f"- command: python benchmarks/prefill.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
