"""`t2mlr analyze …`: the paper's analyses on your own checkpoints and configs.

  t2mlr analyze gradient-fidelity CHECKPOINT --data FILE --out DIR [--depths 2:1,4:4,16:4] [--anchor 32:32]
  t2mlr analyze jacobi-vs-exact CONFIG --out DIR [key=value ...]      # trains 3 arms, evaluates both paths
  t2mlr analyze jacobi-depths CHECKPOINT --data FILE --out DIR [--depths 2,4,8,16,32]
  t2mlr analyze probes CHECKPOINT [BASELINE_CHECKPOINT] --data FILE --offset 1..4 --out DIR
  t2mlr analyze gates RUN_DIR [RUN_DIR ...] --out DIR
  t2mlr analyze placement CONFIG --starts 1,5,9,13,15 [--width D] --out DIR [key=value ...]

CHECKPOINT is any model directory the trainer or save_pretrained wrote (a run's final/, one of its
checkpoints/step_N, a retrofitted pretrained model, a saved baseline). FILE is data the trainer reads:
a jsonl of text (tokenized with the checkpoint's tokenizer) or of input_ids, a shards directory from
`t2mlr data tokenize`, or `train`: the data the checkpoint trained on, as its saved config.yaml names
them (e.g. S5-Retrieval's generated stream, labels aligned as in training). CONFIG is a training config or
preset; the analyses that train derive every arm from it by overrides and train it with the project
trainer into OUT/<arm>, so each arm checkpoints and resumes (--resume) like a `t2mlr train` run.

Each analysis writes OUT/<analysis>.md (the table), OUT/<analysis>.json (every number) and
OUT/<analysis>.png (the figure in the paper's layout).

exit codes: 0 done, 1 a training stopped on a non-finite loss, 2 bad input (a path, a value, a config,
an existing run directory without --resume).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from t2mlr.training.commands import accept_trailing_overrides

__all__ = ["main", "register"]

HELP = {
    "gradient-fidelity": "cosine and relative ℓ2 distance of the gradient at each (d_forward, d_backward) against "
                         "an anchor, with the time per setting",
    "jacobi-vs-exact": "train Jacobi (16,4), exact with bptt_window=4 and the matched Transformer; evaluate each on "
                       "both paths",
    "jacobi-depths": "a trained T²MLR model on the Jacobi path at each depth against its exact path (loss, logits, "
                     "argmax, how far the cache state is from its fixed point)",
    "probes": "two-layer MLP probes on every block's hidden state predicting x(t+offset) (offsets 1 and 2 by "
              "default, or 1..K), T²MLR vs a baseline per offset; the trained heads are saved",
    "gates": "γ_cur and γ_rec over training steps from runs' metrics.jsonl",
    "placement": "validation loss against l_start (or early / middle / late at fixed width D)",
}


def _set_threads(requested: int | None) -> None:
    """--threads, else the cores not busy right now (as `t2mlr train` does)."""
    import torch

    from t2mlr.utils import free_cores

    if requested is not None and requested < 1:
        raise ValueError(f"--threads must be >= 1, got {requested}")
    threads = requested if requested is not None else free_cores()
    torch.set_num_threads(threads)
    print(f"t2mlr analyze: {threads} torch CPU thread(s)", file=sys.stderr)


def _guarded(run: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[[argparse.Namespace], int]:
    """Run an analysis with the documented exit codes and print where its files went."""

    def handler(args: argparse.Namespace) -> int:
        from t2mlr.training.exit_codes import run_with_exit_codes

        def work() -> dict[str, Any]:
            _set_threads(args.threads)
            return run(args)

        code, result = run_with_exit_codes(f"t2mlr analyze {args.analysis}", work)
        if result is None:
            return code
        print(f"wrote {result['markdown']}, {result['json']} and {result['figure']}")
        return 0

    return handler


# ---------------------------------------------------------------------------------------------- handlers


def _gradient_fidelity(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.analysis.gradient_fidelity import parse_depth, parse_depths, run_gradient_fidelity

    return run_gradient_fidelity(
        args.checkpoint, args.data, args.out, depths=parse_depths(args.depths), anchor=parse_depth(args.anchor, "--anchor"),
        batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed, repeats=args.repeats, device=args.device,
        dtype=args.dtype, min_cosine=args.min_cosine, tokenizer=args.tokenizer, eos_token_id=args.eos_token_id,
    )


def _jacobi_vs_exact(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.analysis.jacobi_vs_exact import run_jacobi_vs_exact

    return run_jacobi_vs_exact(
        args.config, args.out, overrides=args.overrides, d_forward=args.d_forward, d_backward=args.d_backward,
        eval_d_forward=args.eval_d_forward, eval_batches=args.eval_batches, resume=args.resume,
        with_transformer=not args.no_transformer, workers=args.workers,
    )


def _jacobi_depths(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.utils import parse_int_list
    from t2mlr.analysis.jacobi_vs_exact import run_jacobi_depths

    return run_jacobi_depths(
        args.checkpoint, args.data, args.out, depths=parse_int_list(args.depths, "--depths"), rows=args.rows,
        batch_size=args.batch_size, seed=args.seed, seq_len=args.seq_len, device=args.device, tokenizer=args.tokenizer,
        eos_token_id=args.eos_token_id,
    )


def _probes(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.analysis.probes import ProbeSettings, parse_offsets, run_probes

    settings = ProbeSettings(kind=args.probe, steps=args.probe_steps, batch_size=args.probe_batch, lr=args.probe_lr,
                             seed=args.seed)
    return run_probes(
        args.checkpoint, args.data, args.out, baseline_dir=args.baseline, offsets=parse_offsets(args.offset),
        rows=args.rows, heldout_fraction=args.heldout_fraction, batch_size=args.batch_size, seq_len=args.seq_len,
        settings=settings, recurrence=args.recurrence, d_forward=args.d_forward, device=args.device, seed=args.seed,
        tokenizer=args.tokenizer, eos_token_id=args.eos_token_id, layers=args.layers, save_heads=not args.no_save_heads,
    )


def _gates(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.analysis.gates import run_gates

    return run_gates(args.run_dirs, args.out, args.labels)


def _placement(args: argparse.Namespace) -> dict[str, Any]:
    from t2mlr.analysis.placement import parse_starts, run_placement

    return run_placement(
        args.config, args.out, parse_starts(args.starts), width=args.width, overrides=args.overrides,
        baseline=args.baseline, with_transformer=not args.no_transformer, eval_batches=args.eval_batches,
        resume=args.resume, workers=args.workers,
    )


# ---------------------------------------------------------------------------------------------- parsers


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: the cores not busy at start-up)")


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="jsonl file or shards directory (t2mlr data tokenize), or "
                        "'train': the data the checkpoint trained on (its saved config.yaml)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per row (default: the checkpoint's training seq_len, from its config.yaml)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer for jsonl text (default: the checkpoint's)")
    parser.add_argument("--eos-token-id", type=int, default=None, help="end-of-text id of jsonl text lines (default: the tokenizer's)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")


def _training_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="training config (YAML path or preset name) of the T²MLR model")
    parser.add_argument("overrides", nargs="*", default=[], help="dotted key=value overrides applied to every arm")
    parser.add_argument("--eval-batches", type=int, default=None,
                        help="validation batches (of eval.batch_size rows of eval.data; default: eval.max_batches)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the arms' runs in OUT from their newest checkpoints (finished arms are only "
                             "re-evaluated)")
    parser.add_argument("--no-transformer", action="store_true", help="do not train the plain Transformer arm")
    parser.add_argument("--workers", type=int, default=1,
                        help="arms trained at a time, each in its own process (default 1: in turn)")
    accept_trailing_overrides(parser)


def _add(sub: Any, name: str, run: Callable[[argparse.Namespace], dict[str, Any]]) -> argparse.ArgumentParser:
    """The subcommand `name`, running `run` with the documented exit codes."""
    parser = sub.add_parser(name, help=HELP[name], description=HELP[name])
    parser.set_defaults(func=_guarded(run))
    return parser


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `analyze` group to a main CLI's subparsers; every leaf sets `func`."""
    from t2mlr.analysis.depth_grid import DEFAULT_ANCHOR, DEFAULT_DEPTHS

    parser = subparsers.add_parser("analyze", help="the paper's analyses on your checkpoints", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")

    grad = _add(sub, "gradient-fidelity", _gradient_fidelity)
    grad.add_argument("checkpoint", help="T²MLR model directory")
    _data_options(grad)
    grad.add_argument("--depths", default=DEFAULT_DEPTHS, help=f"D_FORWARD:D_BACKWARD,... (default {DEFAULT_DEPTHS})")
    grad.add_argument("--anchor", default=DEFAULT_ANCHOR, help=f"D_FORWARD:D_BACKWARD (default {DEFAULT_ANCHOR})")
    grad.add_argument("--batch-size", type=int, default=4, help="rows in the one batch (default 4)")
    grad.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    grad.add_argument("--repeats", type=int, default=1, help="timed passes per setting; the median is reported")
    grad.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    grad.add_argument("--min-cosine", type=float, default=0.99,
                      help="name the cheapest setting whose cosine reaches this (default 0.99)")
    _common(grad)

    jve = _add(sub, "jacobi-vs-exact", _jacobi_vs_exact)
    _training_options(jve)
    jve.add_argument("--d-forward", type=int, default=16, help="Jacobi arm's d_forward (default 16)")
    jve.add_argument("--d-backward", type=int, default=4,
                     help="Jacobi arm's d_backward and the exact arm's bptt_window (default 4)")
    jve.add_argument("--eval-d-forward", type=int, default=None, help="Jacobi evaluation depth (default: --d-forward)")
    _common(jve)

    depths = _add(sub, "jacobi-depths", _jacobi_depths)
    depths.add_argument("checkpoint", help="T²MLR model directory")
    _data_options(depths)
    depths.add_argument("--depths", default="2,4,8,16,32", help="Jacobi d_forward values (default 2,4,8,16,32)")
    depths.add_argument("--rows", type=int, default=64, help="rows drawn from --data (default 64)")
    depths.add_argument("--batch-size", type=int, default=64, help="rows per forward pass (default 64)")
    depths.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    _common(depths)

    probes = _add(sub, "probes", _probes)
    probes.add_argument("checkpoint", help="model directory (T²MLR)")
    probes.add_argument("baseline", nargs="?", default=None, help="model directory of the baseline to compare with")
    _data_options(probes)
    probes.add_argument("--offset", default="1,2",
                        help="offsets k >= 1, comma-separated, or ranges A..B: probe x(t+k) from token t's state "
                             "(1..4 = t+1 … t+4; each below the row length; default 1,2)")
    probes.add_argument("--rows", type=int, default=64, help="rows of --data used (default 64)")
    probes.add_argument("--layers", type=int, default=None, metavar="N",
                        help="probe only the N layers nearest the LM head, ℓ−1 … ℓ−N (the paper: 5; default: all)")
    probes.add_argument("--heldout-fraction", type=float, default=0.25, help="rows held out to score (default 0.25)")
    probes.add_argument("--batch-size", type=int, default=8, help="rows per forward pass (default 8)")
    probes.add_argument("--probe", choices=("linear", "mlp"), default="mlp",
                        help="the paper's two-layer MLP (default) or a linear layer")
    probes.add_argument("--probe-steps", type=int, default=400)
    probes.add_argument("--probe-batch", type=int, default=512, help="tokens per probe step")
    probes.add_argument("--probe-lr", type=float, default=3e-3)
    probes.add_argument("--recurrence", choices=("exact", "jacobi"), default="exact", help="T²MLR's forward path")
    probes.add_argument("--d-forward", type=int, default=None, help="Jacobi depth with --recurrence jacobi")
    probes.add_argument("--seed", type=int, default=0)
    probes.add_argument("--no-save-heads", action="store_true",
                        help="do not write the trained heads to OUT/probe_heads/ (model.safetensors + model.json, "
                             "baseline.*)")
    _common(probes)

    gates = _add(sub, "gates", _gates)
    gates.add_argument("run_dirs", nargs="+", help="run directories holding metrics.jsonl")
    gates.add_argument("--labels", nargs="+", default=None, metavar="NAME",
                       help="one name per run, in order (default: their paths); a name may hold commas: 'T²MLR(2,3)'")
    _common(gates)

    place = _add(sub, "placement", _placement)
    _training_options(place)
    place.add_argument("--starts", required=True,
                       help="l_start values (1-based), or early,middle,late with --width (e.g. 1,5,9,13,15)")
    place.add_argument("--width", type=int, default=None,
                       help="fixed width D: l_end = l_start + D - 1 (default: l_end = L + 1 - l_start)")
    place.add_argument("--baseline", default=None,
                       help="an already trained plain Transformer model directory to compare with (no baseline "
                            "training)")
    _common(place)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: `python -m t2mlr.analysis.commands analyze gates runs/x --out out/`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
