"""Multi-epoch warm starts (`train.warm_start_states`): how far the stored states are from the fixed point
after an epoch of updates, and what starting the Jacobi iteration from them does to the loss and gradients.

A small T²MLR trains for --epochs epochs on a small synthetic set with warm starts. Before the first step of
every epoch after the first, on that step's rows (all stored from their previous visit, one epoch of updates
ago) and with the current weights, it compares against the exact path (the fixed point R*):

    stale      the stored states themselves
    cold       Jacobi (d_forward, d_backward) from the seed pass (what training does without the option)
    warm       Jacobi (d_forward, d_backward) from the stored states (what the option does)

Reported: max |R − R*| and mean |R − R*| / mean |R*| of the final-pass states, |loss − exact loss|, and the
cosine of the loss gradient against the exact path's untruncated gradient and against the replay from the
exact states at depth d_backward (what an RL update from rollout states computes; it is the truncated-BPTT
gradient the Jacobi path approximates). The fusion gates are opened at the start (γ_cur 0.5, γ_rec −0.9,
W_rec × 10) so that the recurrence matters from the first step; a fresh model's γ = 0 makes every start the
fixed point.

    python benchmarks/stale_states.py            # about a minute on one CPU thread
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from typing import Any

import torch

from t2mlr import T2MLRCache
from t2mlr.analysis.benchmarking import machine_info, markdown_table
from t2mlr.training.config import load_config
from t2mlr.training.trainer import Trainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--rows", type=int, default=64, help="training rows (one epoch = rows / batch steps)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-forward", type=int, default=4)
    p.add_argument("--d-backward", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def build_trainer(args: argparse.Namespace, out: str) -> Trainer:
    overrides = [
        f"data.seq_len={args.seq}", f"data.kwargs.num_samples={args.rows}", "data.kwargs.vocab_size=64",
        f"train.global_batch_size={args.batch}", f"train.micro_batch_size={args.batch}",
        f"train.max_steps={args.epochs * args.rows // args.batch}", "train.warm_start_states=true",
        f"model.d_forward={args.d_forward}", f"model.d_backward={args.d_backward}", f"optim.lr={args.lr}",
        "schedule.kind=constant", "eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false",
        "logging.progress_bar=false",
    ]
    trainer = Trainer(load_config("debug", overrides), out)
    with torch.no_grad():
        trainer.model.fusion.gamma_cur.fill_(0.5)
        trainer.model.fusion.gamma_rec.fill_(-0.9)
        trainer.model.fusion.w_rec.weight.mul_(10.0)
    return trainer


def forward(model: Any, batch: dict[str, torch.Tensor], **path: Any) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Loss, its gradient (every parameter) and the final pass's states."""
    cache = T2MLRCache(config=model.config)
    params = [p for p in model.parameters() if p.requires_grad]
    out = model(**batch, past_key_values=cache, use_cache=True, **path)
    grads = torch.autograd.grad(out.loss, params, allow_unused=True)
    return out.loss.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)], cache.recurrent_states


def cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float((x.double() ** 2).sum()) for x in a))
    nb = math.sqrt(sum(float((y.double() ** 2).sum()) for y in b))
    return dot / (na * nb)


def measure(trainer: Trainer, args: argparse.Namespace) -> list[list[str]]:
    rows = trainer._row_sampler.micro_batch(trainer.step, 0)
    batch = trainer.collator([trainer.train_set[i] for i in rows])
    model = trainer.model
    stale = torch.stack([trainer.warm_states.states[i] for i in rows])
    exact_loss, exact_grad, exact = forward(model, batch, recurrence="exact")
    _, replay_grad, _ = forward(model, batch, recurrence="jacobi", initial_states=exact, d_forward=args.d_backward,
                                d_backward=args.d_backward)
    results = []
    scale = float(exact.abs().mean())
    for name, extra in (("stale (stored)", None), ("cold: Jacobi from the seed", {}), ("warm: Jacobi from the stored", {"initial_states": stale})):
        if extra is None:
            states, loss_gap, cos_exact, cos_replay = stale, "", "", ""
        else:
            loss, grad, states = forward(model, batch, recurrence="jacobi", d_forward=args.d_forward,
                                         d_backward=args.d_backward, jacobi_tol=None, **extra)
            loss_gap = f"{abs(float(loss - exact_loss)):.2e}"
            cos_exact, cos_replay = f"{cosine(grad, exact_grad):.4f}", f"{cosine(grad, replay_grad):.4f}"
        gap = (states - exact).abs()
        results.append([str(trainer.step // (args.rows // args.batch) + 1), name, f"{float(gap.max()):.3e}",
                        f"{float(gap.mean()) / scale:.3e}", loss_gap, cos_exact, cos_replay])
    return results


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(torch.device("cpu"))
    steps_per_epoch = args.rows // args.batch
    table: list[list[str]] = []
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(args, out)
        trainer.wrapped.train()
        for epoch in range(args.epochs):
            for _ in range(steps_per_epoch):
                if epoch > 0 and trainer.step % steps_per_epoch == 0:
                    table += measure(trainer, args)
                stats = trainer.train_step(next(trainer.batches))
                trainer.step += 1
            print(f"epoch {epoch + 1}: loss {stats.loss:.4f}, warm-started {stats.warm_started}", flush=True)
    print("\n### Multi-epoch warm starts: stale states against the fixed point\n")
    print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    print(f"- command: python benchmarks/stale_states.py {' '.join(argv)}")
    print(f"- debug-preset T²MLR(2,3), {args.rows} synthetic rows of {args.seq} tokens, batch {args.batch}, "
          f"Jacobi ({args.d_forward}, {args.d_backward}), AdamW lr {args.lr}; measured on the first batch of each epoch\n")
    print(markdown_table(["epoch", "states", "max |R − R*|", "mean |R − R*| / mean |R*|", "|loss − exact loss|",
                          "grad cosine vs exact", f"grad cosine vs replay (d={args.d_backward})"], table))


if __name__ == "__main__":
    main()
