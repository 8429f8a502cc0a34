"""The GRPO update step three ways on one model and one rollout: `T2MLRGRPOTrainer` (TRL, log-probs replayed from
the rollout's exact states), plain `trl.GRPOTrainer` (the model's training path: Jacobi from the seed pass) and the
hand-written update `t2mlr rl grpo` ran before it moved onto TRL (kept here, minimal, as the baseline).

One step = the forward and backward of the update's loss over one micro-batch of completions (TRL's
`compute_loss` + `backward`; the optimizer step, the same for all three, is left out), loss_type "grpo", the
first update on a rollout (π_old = π). The rollout is synthetic but laid out as TRL lays out a real one: prompts of
mixed lengths, left-padded; completions right-padded after an end-of-text token; R after every token from the
exact path, which is what `generate(..., output_recurrent_states=True)` returns.

    T2MLRGRPOTrainer    `exact_states=True`: one middle-block pass, backward of --replay-depth iterates
    hand-written        the same forward through the model's logits (full log-softmax), the old trainer's code
    GRPOTrainer         Jacobi (--d-forward, --d-backward) from the seed pass, TRL's fused LM head

Timing: --repeats rounds after --warmup untimed steps of each; each round runs every variant once, the order
rotated per round; reported: median seconds and the medians of the per-round ratios, with the FLOP model's ratio
beside each (`t2mlr.baselines.costs`: the replay as `replay_middle_flops`, Jacobi as `train_step_flops`; the
LM head at every position in all three, as TRL's fused head on a CPU and the old code do). The script also checks
that the two replayed updates give the same gradient (the same math; its norm to 1e-4) and prints Jacobi's.

    python benchmarks/grpo_update.py                                   # SmolLM2-135M shape, T²MLR(13,18), 1 thread
    python benchmarks/grpo_update.py --hidden 64 --vocab 128 --repeats 1 --warmup 0     # seconds (tests)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from typing import Any

import torch

from t2mlr import T2MLRCache, T2MLRConfig, T2MLRForCausalLM
from t2mlr.analysis.benchmarking import machine_info, markdown_table, open_gates, timed
from t2mlr.baselines.costs import DecoderShape, causal_pairs, replay_middle_flops, train_step_flops
from t2mlr.model.shapes import smollm2_shaped_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--placement", default="13-18", help="l_start-l_end (1-based blocks)")
    p.add_argument("--hidden", type=int, default=576, help="576: SmolLM2-135M; smaller keeps its proportions (tests)")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--completions", type=int, default=8, help="rows of the micro-batch (prompts × group size)")
    p.add_argument("--prompt", type=int, default=48, help="longest prompt; the others are shorter (left padding)")
    p.add_argument("--completion", type=int, default=16, help="longest completion (max_completion_length)")
    p.add_argument("--replay-depth", type=int, default=4)
    p.add_argument("--d-forward", type=int, default=16)
    p.add_argument("--d-backward", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps of each (at least 1: it checks the gradients)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------- the rollout
def build_model(args: argparse.Namespace) -> T2MLRForCausalLM:
    l_start, l_end = (int(x) for x in args.placement.split("-"))
    config = T2MLRConfig.from_base(smollm2_shaped_config(args.hidden, vocab_size=args.vocab), l_start=l_start,
                                   l_end=l_end, d_forward=args.d_forward, d_backward=args.d_backward)
    torch.manual_seed(0)
    return open_gates(T2MLRForCausalLM(config)).train()


def synthetic_rollout(model: T2MLRForCausalLM, args: argparse.Namespace, pad: int, eos: int) -> dict[str, torch.Tensor]:
    """TRL's rollout dictionary for `args.completions` rows, with the exact states a rollout's generate() returns."""
    rows, generator = args.completions, torch.Generator().manual_seed(1)
    prompt_lengths = [args.prompt - (i % 4) * (args.prompt // 8) for i in range(rows)]  # four lengths
    completion_lengths = [args.completion - (i % 3) * (args.completion // 4) for i in range(rows)]  # some stop early
    prompt_ids = torch.full((rows, args.prompt), pad)
    completion_ids = torch.full((rows, args.completion), pad)
    for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        prompt_ids[i, args.prompt - p:] = torch.randint(3, args.vocab, (p,), generator=generator)
        completion_ids[i, : c - 1] = torch.randint(3, args.vocab, (c - 1,), generator=generator)
        completion_ids[i, c - 1] = eos
    prompt_mask, completion_mask = prompt_ids.ne(pad).long(), torch.zeros_like(completion_ids)
    for i, c in enumerate(completion_lengths):
        completion_mask[i, :c] = 1
    advantages = torch.randn(rows, generator=generator)
    ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    cache = T2MLRCache(config=model.config.base_config)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True, recurrence="exact")
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": (advantages - advantages.mean()) / advantages.std(),
            "num_items_in_batch": completion_mask.sum(), "recurrent_states": cache.recurrent_states}


# ------------------------------------------------------------------------------------------- the three steps
def trl_trainers(model: T2MLRForCausalLM, args: argparse.Namespace, work_dir: str) -> tuple[Any, Any, Any]:
    """T2MLRGRPOTrainer and plain GRPOTrainer around the same model (fp32, no gradient checkpointing), and the
    word tokenizer they are given (its pad and end-of-text ids lay out the rollout)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from t2mlr.rl.trainer import T2MLRGRPOConfig, T2MLRGRPOTrainer
    from t2mlr.tasks.tokenizers import build_word_tokenizer

    tokenizer = build_word_tokenizer(("a", "b"))
    common = dict(output_dir=work_dir, per_device_train_batch_size=args.completions, num_generations=2,
                  max_completion_length=args.completion, loss_type="grpo", bf16=False, use_cpu=True, report_to="none",
                  save_strategy="no", gradient_checkpointing=False, disable_tqdm=True)
    dataset = Dataset.from_dict({"prompt": ["a b"] * args.completions})
    ours = T2MLRGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                            args=T2MLRGRPOConfig(**common, replay_depth=args.replay_depth), train_dataset=dataset,
                            processing_class=tokenizer)
    plain = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                        args=GRPOConfig(**common), train_dataset=dataset, processing_class=tokenizer)
    for trainer in (ours, plain):
        trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before compute_loss
    ours._rollout_step = ours.state.global_step  # the rollout is the current policy's: the one-pass replay
    return ours, plain, tokenizer


def gradient_norm_then_clear(model: T2MLRForCausalLM) -> float:
    """The gradient's norm (over every parameter), then the gradients cleared for the next step."""
    norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])))
    model.zero_grad(set_to_none=True)
    return norm


def trl_step(trainer: Any, model: T2MLRForCausalLM, inputs: dict[str, torch.Tensor]) -> float:
    trainer.compute_loss(model, inputs).backward()
    return gradient_norm_then_clear(model)


def hand_written_step(model: T2MLRForCausalLM, inputs: dict[str, torch.Tensor], depth: int,
                      temperature: float = 1.0, epsilon: float = 0.2) -> float:
    """The update of the former `t2mlr.training.grpo.GrpoTrainer.policy_loss` (one iteration, loss_type "grpo"):
    a replayed forward through the model's logits, log-softmax, the clipped ratio, token weights, backward."""
    prompt_length = inputs["prompt_ids"].shape[1]
    sequences = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    out = model(input_ids=sequences, attention_mask=attention, recurrence="jacobi", initial_states=inputs["recurrent_states"],
                d_forward=depth, d_backward=depth, exact_states=True)
    logits = out.logits[:, prompt_length - 1 : -1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    ratio = torch.exp(log_probs - log_probs.detach())
    advantages = inputs["advantages"][:, None]
    losses = -torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
    mask = inputs["completion_mask"].float()
    weights = mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0) / mask.shape[0]
    (losses * weights).sum().backward()
    return gradient_norm_then_clear(model)


# ------------------------------------------------------------------------------------------- FLOP model
def predicted_flops(model: T2MLRForCausalLM, args: argparse.Namespace) -> dict[str, float]:
    """Forward + backward FLOPs of one row of prompt + completion tokens on each path."""
    config, length = model.config, args.prompt + args.completion
    shape = DecoderShape.of(config)
    middle = config.l_end - config.l_start + 1
    outside = (shape.layers - middle) * (shape.block_matmuls(length) + shape.attention(causal_pairs(length))) + shape.head(length)
    replay = 3 * outside + replay_middle_flops(shape, length, middle, args.replay_depth)
    return {"T2MLRGRPOTrainer": replay, "hand-written": replay, "GRPOTrainer": train_step_flops(config, length)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    info = machine_info(torch.device("cpu"))  # the date and the load at the start
    model = build_model(args)
    with tempfile.TemporaryDirectory() as work_dir:
        ours, plain, tokenizer = trl_trainers(model, args, work_dir)
        inputs = synthetic_rollout(model, args, tokenizer.pad_token_id, tokenizer.eos_token_id)
        steps = {
            "T2MLRGRPOTrainer": lambda: trl_step(ours, model, inputs),
            "hand-written": lambda: hand_written_step(model, inputs, args.replay_depth),
            "GRPOTrainer": lambda: trl_step(plain, model, inputs),
        }
        norms = {name: step() for name, step in steps.items()}  # also the first warm-up
        for _ in range(max(args.warmup - 1, 0)):
            for step in steps.values():
                step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        names = list(steps)
        for round_index in range(args.repeats):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(timed(steps[name], torch.device("cpu")))
            print(f"  round {round_index + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in names), flush=True)
    if abs(norms["T2MLRGRPOTrainer"] - norms["hand-written"]) > 1e-4 * norms["hand-written"]:
        raise AssertionError(f"the two replayed updates compute different gradients: norms {norms}")
    flops = predicted_flops(model, args)
    median = {name: statistics.median(values) for name, values in times.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731
    import trl

    info["trl"] = trl.__version__
    print(f"\n### GRPO update step: T2MLRGRPOTrainer vs plain GRPOTrainer vs the hand-written step "
          f"(SmolLM2-135M shape, hidden {args.hidden}, vocabulary {args.vocab}, T²MLR({args.placement.replace('-', ',')}))\n")
    print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    print(f"- command: python benchmarks/grpo_update.py {' '.join(argv)}")
    print(f"- micro-batch: {args.completions} completions, prompts ≤ {args.prompt} tokens (left-padded), completions "
          f"≤ {args.completion}; fp32; replay depth {args.replay_depth}; Jacobi ({args.d_forward}, {args.d_backward}); "
          f"medians of {args.repeats} rotated rounds after {args.warmup} warm-up")
    print(f"- gradient norms: T2MLRGRPOTrainer {norms['T2MLRGRPOTrainer']:.6g}, hand-written {norms['hand-written']:.6g}, "
          f"GRPOTrainer (Jacobi) {norms['GRPOTrainer']:.6g}\n")
    rows = [[name, f"{median[name]:.3f}", f"{ratio(name, 'T2MLRGRPOTrainer'):.2f}×",
             f"{flops[name] / flops['T2MLRGRPOTrainer']:.2f}×"] for name in names]
    print(markdown_table(["update step", "median s", "÷ T2MLRGRPOTrainer (measured)", "÷ T2MLRGRPOTrainer (FLOPs)"], rows))
    return {"median_s": median, "gradient_norms": norms, "flops": flops,
            "ratios": {name: ratio(name, "T2MLRGRPOTrainer") for name in names}}


if __name__ == "__main__":
    main()
