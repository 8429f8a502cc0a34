"""CLI subcommands `train`, `plot` and `tokenize`, registered into the main `t2mlr` parser by `register`.

    t2mlr train CONFIG.yaml --out runs/x [--max-steps N] [--resume] [--parallel ddp|fsdp] [key=value ...]
    torchrun --nproc_per_node 8 -m t2mlr train CONFIG.yaml --out runs/x --parallel fsdp
    t2mlr plot runs/x [--out curves.png]
    t2mlr tokenize corpus.jsonl data/train.npy --tokenizer HuggingFaceTB/SmolLM2-135M

CONFIG is a YAML path or a preset name from configs/ (e.g. `debug`). Overrides are dotted keys,
`optim.lr=1e-3 model.l_start=9`; they may also follow the options (see `_accept_trailing_overrides`).
Handlers return a process exit code: 0 done, 1 training stopped (non-finite loss), 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("t2mlr.training")


def register(subparsers: Any) -> None:
    """Add `train`, `plot` and `tokenize` to an `argparse` subparsers object; each sets `func` to its handler."""
    train = subparsers.add_parser("train", help="train a T²MLR model from a YAML config or preset",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("config", help="YAML config path or preset name (configs/<name>.yaml)")
    train.add_argument("overrides", nargs="*", default=[], help="dotted key=value overrides, e.g. optim.lr=1e-3")
    train.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl, train.log)")
    train.add_argument("--max-steps", type=int, default=None, help="set train.max_steps")
    train.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    train.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default=None,
                       help="data parallelism under torchrun (sets train.parallel)")
    train.set_defaults(func=run_train)
    _accept_trailing_overrides(train)

    plot = subparsers.add_parser("plot", help="plot loss and fusion-gate curves of a run to PNG")
    plot.add_argument("run_dir", help="run directory holding metrics.jsonl")
    plot.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    plot.set_defaults(func=run_plot)
    register_tokenize(subparsers)


def register_tokenize(subparsers: Any) -> None:
    """`tokenize IN.jsonl OUT.npy --tokenizer T`: pre-tokenize a corpus for `data.source: tokens`."""
    tok = subparsers.add_parser("tokenize", help="tokenize a jsonl corpus into a .npy token stream")
    tok.add_argument("jsonl", help="lines of {\"text\": ...} or {\"input_ids\": [...]}")
    tok.add_argument("output", help=".npy file to write")
    tok.add_argument("--tokenizer", default=None, help="tokenizer path or hub id (needed for text lines)")
    tok.add_argument("--eos-token-id", type=int, default=None, help="document separator (default: tokenizer's eos)")
    tok.add_argument("--text-field", default="text")
    tok.set_defaults(func=run_tokenize)


def _accept_trailing_overrides(parser: argparse.ArgumentParser) -> None:
    """Let `key=value` overrides follow options (`train cfg.yaml --out x a=1`).

    argparse fills a `nargs="*"` positional as soon as it meets the first positional, so later
    `key=value` words would be rejected as unrecognized. This parser (and only this one) moves such
    leftover words into `overrides`; anything else stays unrecognized and errors as usual.
    """

    def parse_known_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = argparse.ArgumentParser.parse_known_args(self, args, namespace)
        trailing = [word for word in extras if "=" in word and not word.startswith("-")]
        namespace.overrides = list(getattr(namespace, "overrides", None) or []) + trailing
        return namespace, [word for word in extras if word not in trailing]

    parser.parse_known_args = types.MethodType(parse_known_args, parser)  # type: ignore[method-assign]


def train_overrides(args: argparse.Namespace) -> list[str]:
    """CLI flags as config overrides (flags win over positional overrides)."""
    overrides = list(args.overrides or [])
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.parallel is not None:
        overrides.append(f"train.parallel={args.parallel}")
    return overrides


def run_train(args: argparse.Namespace) -> int:
    from t2mlr.training.checkpoint import CheckpointError
    from t2mlr.training.config import ConfigError, load_config
    from t2mlr.training.trainer import NonFiniteLossError, train

    try:
        cfg = load_config(args.config, train_overrides(args))
    except ConfigError as err:
        print(f"t2mlr train: config error: {err}", file=sys.stderr)
        return 2
    try:
        result = train(cfg, args.out, resume=args.resume)
    except NonFiniteLossError as err:
        print(f"t2mlr train: stopped: {err}", file=sys.stderr)
        return 1
    except (CheckpointError, FileExistsError, ConfigError) as err:
        print(f"t2mlr train: {err}", file=sys.stderr)
        return 2
    log.info("done at step %d; last checkpoint: %s", result.step, result.last_checkpoint)
    return 0


def run_tokenize(args: argparse.Namespace) -> int:
    """Exit 0 with the token count printed; 2 with a one-line message on bad input (nothing is left behind)."""
    from t2mlr.training.data import TOKEN_FILE_LIMIT, DataError, read_jsonl_documents, write_token_file
    from t2mlr.utils import TokenizerNotFoundError, load_tokenizer

    try:
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
        eos = args.eos_token_id if args.eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise DataError("no EOS id: pass --eos-token-id or a tokenizer with an eos token")
        docs = read_jsonl_documents(args.jsonl, tokenizer, args.text_field, append_eos=True, eos_token_id=eos,
                                    vocab_size=TOKEN_FILE_LIMIT)
        count = write_token_file(docs, args.output, eos)
    except (DataError, TokenizerNotFoundError) as err:
        print(f"t2mlr tokenize: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # write_token_file's check of --eos-token-id
        print(f"t2mlr tokenize: {err}", file=sys.stderr)
        return 2
    print(f"{args.output}: {count} tokens, documents separated by {eos}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    from t2mlr.training.plot import plot_run

    try:
        path = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"t2mlr plot: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: `python -m t2mlr.training train ...` (same as `t2mlr train ...`)."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv, prog="python -m t2mlr.training")
