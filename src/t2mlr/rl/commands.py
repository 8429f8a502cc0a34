"""`t2mlr rl grpo CONFIG --out DIR`: reinforcement learning on verifiable tasks (see `t2mlr.rl.grpo`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from t2mlr.training.commands import accept_trailing_overrides

GRPO_DESCRIPTION = """\
GRPO on a verifiable task with T2MLRGRPOTrainer: TRL's GRPOTrainer whose per-token log-probabilities are
replayed from the recurrent states the rollout's generate() computed (exact while the policy is the one that
sampled them; the iterated replay, depth grpo.replay_depth, once it has moved).

examples:
  t2mlr rl grpo grpo_tiny --out runs/grpo_tiny                      # a fresh tiny model, seconds on a CPU
  t2mlr rl grpo grpo_cpu --out runs/grpo_cpu                        # from the SFT policy of grpo_va_sft_cpu
  t2mlr rl grpo grpo_cpu --out runs/grpo_cpu --resume               # continue from the newest checkpoint

The run directory gets config.yaml, train.log, metrics.jsonl (TRL's metrics per logged step: reward, loss,
KL, clip ratios, entropy, timings; the greedy eval accuracy), checkpoints/checkpoint-N, final/ and reward.png.
Several processes: torchrun --nproc_per_node N -m t2mlr rl grpo CONFIG --out DIR (docs/rl.md).

exit codes: 0 done or stopped as asked, 2 bad input (config, checkpoint, or a resume with another config)."""


def register(subparsers: Any) -> None:
    """Add `rl` (with its `grpo` subcommand) to the `t2mlr` parser."""
    rl = subparsers.add_parser("rl", help="reinforcement learning with replayed recurrent states (GRPO on TRL)",
                               description="Reinforcement learning on verifiable tasks.")
    algorithms = rl.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    grpo = algorithms.add_parser("grpo", help="GRPO with replayed recurrent states", description=GRPO_DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    grpo.add_argument("config", help="YAML config path or preset name (configs/<name>.yaml)")
    grpo.add_argument("overrides", nargs="*", default=[], help="dotted key=value overrides, e.g. grpo.beta=0.04")
    grpo.add_argument("--out", required=True, help="run directory")
    grpo.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    grpo.add_argument("--stop-after", type=int, default=None, metavar="N", help="stop after step N with a checkpoint")
    grpo.add_argument("--threads", type=int, default=1, metavar="N", help="torch CPU threads (default 1)")
    grpo.set_defaults(func=run_grpo_command)
    accept_trailing_overrides(grpo)


def run_grpo_command(args: argparse.Namespace) -> int:
    from t2mlr.rl.config import check_grpo_before_loading
    from t2mlr.training.exit_codes import run_with_exit_codes

    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    code, _ = run_with_exit_codes("t2mlr rl grpo", lambda: check_grpo_before_loading(args.config, args.overrides))
    if code:  # a typo is reported before torch and TRL load
        return code
    import torch

    from t2mlr.rl.grpo import load_grpo_config, run_grpo

    torch.set_num_threads(args.threads)
    code, records = run_with_exit_codes("t2mlr rl grpo", lambda: run_grpo(
        load_grpo_config(args.config, args.overrides), args.out, resume=args.resume, stop_after=args.stop_after))
    if code:
        return code
    sampled = [record for record in records or [] if "reward" in record]  # steps that reused a rollout have none
    if sampled and os.environ.get("RANK", "0") == "0":
        print(f"step {sampled[-1]['step']}: mean reward {sampled[-1]['reward']:.3f}; run directory {args.out}")
    return 0
