"""Policy-update step with replayed states against Jacobi (16, 4) and the plain Transformer; gradient fidelity
of the replay against the (32, 32) Jacobi anchor on a trained checkpoint.

In on-policy RL the rollout's generate() has already computed the exact recurrent states of every token, so
the update starts the Jacobi iteration from them (`initial_states=`) with d_forward = d_backward: no seed
pass and no detached passes. One step = forward + backward + gradient clipping + AdamW over one row, as in
the trainer. Four variants share one model's weights and optimizer:

    plain            the base decoder alone (the Transformer the T²MLR model wraps)
    replay           T²MLR from the row's exact states, `exact_states=True`: one middle-block pass whose
                     backward is that of d = --replay-depth (4) iterates (t2mlr.model.fixed_point); GRPO's update
    replay iterated  the same gradient the long way: d iterates and the final pass, each with its graph
    jacobi           T²MLR, Jacobi from the seed pass, (--d-forward, --d-backward) = (16, 4)

Timing: --repeats rounds after --warmup untimed steps of each; each round runs every variant once, the order
rotated per round; reported: median step times and the medians of the per-round ratios, with the FLOP model's
ratio beside each (`t2mlr.baselines.costs.DecoderShape`; the iterated replay counts d + 1 fused middle-block
passes, all with gradients; the one-pass replay one pass, one backward and d products with respect to R,
each costed as the block's matmuls once and its attention twice). Gates are set to γ_cur = -0.5,
γ_rec = 0.5 (a fresh model's γ = 0 would make Φ the identity).

Gradient fidelity (--checkpoint DIR, a checkpoint of a `t2mlr train` run: its config.yaml names the data): on
the run's own training rows, the cosine between the replay's loss gradient (from the
exact states, depth --replay-depth) and the Jacobi (32, 32) anchor's, and against the exact path's
untruncated gradient.

    python benchmarks/replay_overhead.py --seq 128 --repeats 5              # SmolLM2-135M shape, 1 CPU thread
    python benchmarks/replay_overhead.py --checkpoint runs/grpo_sft/final --skip-timing
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from t2mlr import T2MLRCache, T2MLRConfig, T2MLRForCausalLM
from t2mlr.analysis.benchmarking import (
    machine_info,
    markdown_table,
    open_gates,
    parse_placements,
    timed,
)
from t2mlr.baselines.costs import (
    DecoderShape,
    causal_pairs,
    replay_middle_flops,
    train_step_flops,
)
from t2mlr.model.shapes import smollm2_shaped_config
from t2mlr.training.config import OptimConfig
from t2mlr.training.optim import build_optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--placements", type=parse_placements, default=parse_placements("13-18,5-26"))
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=576, help="576: SmolLM2-135M; smaller keeps its proportions (tests)")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--replay-depth", type=int, default=4)
    p.add_argument("--d-forward", type=int, default=16)
    p.add_argument("--d-backward", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint", type=Path, default=None, help="trained T²MLR directory for the gradient fidelity")
    p.add_argument("--fidelity-rows", type=int, default=8)
    p.add_argument("--skip-timing", action="store_true")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------- FLOP model
def _middle_and_outside(config: Any, seq_len: int) -> tuple[DecoderShape, int, float, float]:
    """The shape, the middle block's length, one block's FLOPs and those of everything outside the middle
    block (the other blocks and the LM head), forward, over one row."""
    shape = DecoderShape.of(config)
    block = shape.block_matmuls(seq_len) + shape.attention(causal_pairs(seq_len))
    middle = config.l_end - config.l_start + 1
    return shape, middle, block, (shape.layers - middle) * block + shape.head(seq_len)


def replay_step_flops(config: Any, seq_len: int, depth: int) -> float:
    """Forward + backward of one row on the replayed Jacobi path: `depth` fused iterates plus the final pass,
    every one carrying gradients; the first reads given (detached) states, so it has no input gradient
    through W_rec r. No seed pass, no detached pass."""
    shape, middle, block, outside = _middle_and_outside(config, seq_len)
    passes = depth + 1
    forward = outside + passes * middle * block + passes * shape.fusion(seq_len)
    backward = 2 * forward - 2 * seq_len * shape.hidden**2
    return forward + backward


def one_pass_replay_step_flops(config: Any, seq_len: int, depth: int) -> float:
    """Forward + backward of one row replayed with `exact_states=True` (`t2mlr.baselines.costs.replay_middle_flops`
    for the middle block; everything else once, with its backward)."""
    shape, middle, _, outside = _middle_and_outside(config, seq_len)
    return 3 * outside + replay_middle_flops(shape, seq_len, middle, depth)


def base_shape(args: argparse.Namespace) -> Any:
    """SmolLM2-135M (hidden 576, vocabulary 49152), or its proportions at another width."""
    return smollm2_shaped_config(args.hidden, vocab_size=args.vocab)


def t2mlr_config(l_start: int, l_end: int, args: argparse.Namespace, **settings: Any) -> T2MLRConfig:
    return T2MLRConfig.from_base(base_shape(args), l_start=l_start, l_end=l_end, **settings)


def predicted_ratios(l_start: int, l_end: int, args: argparse.Namespace) -> dict[str, float]:
    plain = train_step_flops(base_shape(args), args.seq)
    jacobi = train_step_flops(t2mlr_config(l_start, l_end, args, d_forward=args.d_forward, d_backward=args.d_backward),
                              args.seq)
    iterated = replay_step_flops(t2mlr_config(l_start, l_end, args), args.seq, args.replay_depth)
    replay = one_pass_replay_step_flops(t2mlr_config(l_start, l_end, args), args.seq, args.replay_depth)
    return {"replay/plain": replay / plain, "iterated/plain": iterated / plain, "jacobi/plain": jacobi / plain,
            "jacobi/replay": jacobi / replay, "jacobi/iterated": jacobi / iterated}


# ------------------------------------------------------------------------------------------- timing
def exact_states(model: T2MLRForCausalLM, **inputs: Any) -> torch.Tensor:
    """R after every token from the exact path: what `generate(..., output_recurrent_states=True)` hands a
    rollout's update."""
    cache = T2MLRCache(config=model.config)
    with torch.no_grad():
        model(**inputs, past_key_values=cache, use_cache=True, recurrence="exact")
    return cache.recurrent_states


def step_function(model: T2MLRForCausalLM, optimizer: torch.optim.Optimizer, forward: Callable[[], Any]) -> Callable[[], None]:
    def step() -> None:
        loss = forward().loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def time_placement(l_start: int, l_end: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model = T2MLRForCausalLM(t2mlr_config(l_start, l_end, args)).train()
    open_gates(model)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-7, weight_decay=0.0))
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    states = exact_states(model, input_ids=ids)
    depth = args.replay_depth
    plain = model.base_decoder()
    variants = {
        "plain": step_function(model, optimizer, lambda: plain(ids, labels=ids)),
        "replay": step_function(model, optimizer, lambda: model(ids, labels=ids, recurrence="jacobi", initial_states=states,
                                                                 d_backward=depth, exact_states=True)),
        "iterated": step_function(model, optimizer, lambda: model(ids, labels=ids, recurrence="jacobi", initial_states=states,
                                                                   d_forward=depth, d_backward=depth)),
        "jacobi": step_function(model, optimizer, lambda: model(ids, labels=ids, recurrence="jacobi", d_forward=args.d_forward,
                                                                 d_backward=args.d_backward, jacobi_tol=None)),
    }
    device = torch.device("cpu")
    for step in variants.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(args.repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(variants[name], device))
        print(f"  ({l_start},{l_end}) round {round_index + 1}: "
              + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))
    return {
        "median_s": {name: statistics.median(values) for name, values in times.items()},
        "replay/plain": ratio("replay", "plain"), "iterated/plain": ratio("iterated", "plain"),
        "jacobi/plain": ratio("jacobi", "plain"), "jacobi/replay": ratio("jacobi", "replay"),
        "jacobi/iterated": ratio("jacobi", "iterated"), "predicted": predicted_ratios(l_start, l_end, args),
    }


# ------------------------------------------------------------------------------------------- fidelity
def checkpoint_rows(checkpoint: Path, count: int) -> dict[str, torch.Tensor]:
    """The first `count` training rows of the run that wrote the checkpoint (its config.yaml names the data)."""
    from t2mlr.training.config import load_config
    from t2mlr.training.data import Collator, build_dataset, labels_aligned

    cfg = load_config(checkpoint / "config.yaml")
    dataset = build_dataset(cfg.data)
    collator = Collator(cfg.data.pad_token_id, labels_aligned(dataset, cfg.data))
    return collator([dataset[i] for i in range(count)])


def fidelity(args: argparse.Namespace) -> list[list[str]]:
    """Cosines of the replay gradient (and of Jacobi from the seed) against the (32, 32) anchor and the exact
    path, on the checkpoint's own training rows, in float64."""
    from t2mlr.analysis.gradient_fidelity import compare_gradients

    model = T2MLRForCausalLM.from_pretrained(args.checkpoint).to(torch.float64).eval()
    batch = checkpoint_rows(args.checkpoint, args.fidelity_rows)
    mask = batch.get("attention_mask")
    states = exact_states(model, **batch)  # the rollout's states: the exact path over the same rows
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient(**path: Any) -> list[torch.Tensor]:
        loss = model(**batch, **path).loss
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    anchor = gradient(recurrence="jacobi", d_forward=32, d_backward=32, jacobi_tol=None)
    exact = gradient(recurrence="exact")
    depth = args.replay_depth
    settings = {
        f"replay, one pass (exact_states), d = {depth}": {"recurrence": "jacobi", "initial_states": states,
                                                          "d_backward": depth, "exact_states": True},
        f"replay d_f = d_b = {depth}": {"recurrence": "jacobi", "initial_states": states, "d_forward": depth, "d_backward": depth},
        "replay d_f = d_b = 1": {"recurrence": "jacobi", "initial_states": states, "d_forward": 1, "d_backward": 1},
        "replay d_f = d_b = 8": {"recurrence": "jacobi", "initial_states": states, "d_forward": 8, "d_backward": 8},
        f"Jacobi from the seed ({args.d_forward}, {args.d_backward})": {"recurrence": "jacobi", "d_forward": args.d_forward,
                                                                           "d_backward": args.d_backward, "jacobi_tol": None},
        f"Jacobi from the seed ({depth}, {depth})": {"recurrence": "jacobi", "d_forward": depth, "d_backward": depth, "jacobi_tol": None},
    }
    table = []
    for name, path in settings.items():
        grad = gradient(**path)
        cos_anchor, rel_anchor = compare_gradients(grad, anchor)
        cos_exact, _ = compare_gradients(grad, exact)
        table.append([name, f"{cos_anchor:.4f}", f"{rel_anchor:.3f}", f"{cos_exact:.4f}"])
    gates = {n: round(float(getattr(model.fusion, n).detach()), 3) for n in model.fusion.gate_names}
    rows, length = batch["input_ids"].shape
    padded = "" if mask is None else ", right-padded"
    print(f"\nfidelity: {args.checkpoint} (T²MLR({model.config.l_start},{model.config.l_end}), gates {gates}), "
          f"{rows} of its training rows, {length} tokens{padded}, float64")
    return table


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(torch.device("cpu"))
    print(f"\n### Policy-update step: replay vs Jacobi vs plain Transformer (SmolLM2-135M shape, hidden {args.hidden}, vocabulary {args.vocab})\n")
    print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    print(f"- command: python benchmarks/replay_overhead.py {' '.join(argv)}\n")
    if not args.skip_timing:
        rows = []
        for l_start, l_end in args.placements:
            result = time_placement(l_start, l_end, args)
            p = result["predicted"]
            m = result["median_s"]
            measured = lambda key: f"{result[key]:.2f}× (FLOPs {p[key]:.2f}×)"
            rows.append([f"({l_start},{l_end})", f"{m['plain']:.2f}", f"{m['replay']:.2f}", f"{m['iterated']:.2f}",
                         f"{m['jacobi']:.2f}", measured("replay/plain"), measured("iterated/plain"),
                         measured("jacobi/plain"), measured("jacobi/replay"), measured("jacobi/iterated")])
        print(f"\nseq {args.seq}, batch {args.batch}, fp32, replay depth {args.replay_depth}, Jacobi "
              f"({args.d_forward}, {args.d_backward}); medians of {args.repeats} rotated rounds after {args.warmup} warm-up\n")
        print(markdown_table(["placement", "plain s", "replay s", "iterated replay s",
                              f"Jacobi ({args.d_forward},{args.d_backward}) s", "replay / plain", "iterated / plain",
                              "Jacobi / plain", "Jacobi / replay (speed-up)", "Jacobi / iterated"], rows))
    if args.checkpoint is not None:
        print()
        print(markdown_table(["gradient", "cosine vs Jacobi (32,32)", "rel. l2 vs (32,32)", "cosine vs exact"],
                             fidelity(args)))


if __name__ == "__main__":
    main()
