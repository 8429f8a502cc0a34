"""``t2mlr data …``: command-line generation of the synthetic task datasets.

The main CLI calls ``register(subparsers)``; every leaf parser sets ``func`` (``args → exit
code``), so the caller runs ``args.func(args)``. ``main(argv)`` runs this group on its own.

Each command writes ``train.jsonl``, ``eval.jsonl`` and ``meta.json`` (the settings used) into
``--out`` (S5-Retrieval also writes the word-level tokenizer to ``tokenizer/``) and prints every
path it wrote. Eval sets use random streams independent of the training stream; for variable
assignment and ProsQA-Hard, eval samples whose prompt also occurs in the training set are
dropped (S5 dictionaries are drawn fresh per sequence, so collisions are negligible there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.prosqa import generate_prosqa_hard
from t2mlr.tasks.s5_retrieval import DEFAULT_ALPHABET, generate_s5_eval, iter_s5_retrieval
from t2mlr.tasks.tokenizers import build_s5_tokenizer
from t2mlr.tasks.variable_assignment import generate_variable_assignment

__all__ = ["main", "parse_range", "register"]


def parse_range(text: str) -> tuple[int, int]:
    """``"1-32"`` → (1, 32); ``"8"`` → (8, 8); inclusive bounds."""
    parts = text.split("-")
    try:
        values = [int(p) for p in parts]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI, got {text!r}") from err
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI with LO <= HI, got {text!r}")
    return values[0], values[1]


def _write(records: Any, path: Path) -> None:
    count = write_jsonl(records, path)
    print(f"wrote {count} samples to {path}")


def _write_meta(out: Path, args: argparse.Namespace) -> None:
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    path = out / "meta.json"
    path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote settings to {path}")


def _disjoint_eval(
    generate: Callable[[int], list[dict[str, Any]]], size: int, train_keys: set[str], key: str
) -> list[dict[str, Any]]:
    """First ``size`` eval samples (deterministic stream) whose ``key`` is not in training."""
    count = max(size, 1)
    while True:
        kept = [s for s in generate(count) if s[key] not in train_keys]
        if len(kept) >= size:
            return kept[:size]
        if count >= 16 * max(size, 1):
            raise ValueError(f"only {len(kept)} eval samples differ from the training set; lower --eval-size")
        count *= 2


def _run_s5(args: argparse.Namespace) -> int:
    # Both calls validate every setting before anything is written.
    train = iter_s5_retrieval(
        args.train_size, args.train_n, args.k, args.dict_size, args.seed, args.alphabet, stream="train"
    )
    tokenizer = build_s5_tokenizer(args.k, args.alphabet)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    print(f"wrote tokenizer to {out / 'tokenizer'}")
    _write(train, out / "train.jsonl")
    evals = generate_s5_eval(args.eval_size, args.eval_n, args.k, args.dict_size, args.seed, args.alphabet)
    _write(evals, out / "eval.jsonl")
    _write_meta(out, args)
    return 0


def _run_variable_assignment(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def gen(count: int, stream: str) -> list[dict[str, Any]]:
        return generate_variable_assignment(
            count, args.depth, args.num_constants, args.num_distractors, args.seed, stream
        )

    train = gen(args.size, "train")
    _write(train, out / "train.jsonl")
    evals = _disjoint_eval(lambda c: gen(c, "eval"), args.eval_size, {s["prompt"] for s in train}, "prompt")
    _write(evals, out / "eval.jsonl")
    _write_meta(out, args)
    return 0


def _run_prosqa(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def gen(count: int, stream: str) -> list[dict[str, Any]]:
        return generate_prosqa_hard(count, args.nodes, args.path_len, args.edge_factor, args.seed, stream)

    train = gen(args.train_size, "train")
    _write(train, out / "train.jsonl")
    evals = _disjoint_eval(lambda c: gen(c, "eval"), args.eval_size, {s["question"] for s in train}, "question")
    _write(evals, out / "eval.jsonl")
    _write_meta(out, args)
    return 0


def _add_s5(sub: Any) -> None:
    p = sub.add_parser("s5-retrieval", help="S5-Retrieval (state tracking + in-context retrieval)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--k", type=int, default=4, help="value length K (default 4)")
    p.add_argument("--train-n", type=parse_range, default=(1, 32), help="training N range LO-HI (default 1-32)")
    p.add_argument("--eval-n", type=parse_range, default=(1, 48), help="eval N range LO-HI (default 1-48)")
    p.add_argument("--train-size", type=int, default=10000, help="training samples (default 10000)")
    p.add_argument("--eval-size", type=int, default=100, help="eval samples per N (default 100)")
    p.add_argument("--dict-size", type=int, default=120, help="dictionary entries, >= largest N (default 120)")
    p.add_argument("--alphabet", default=DEFAULT_ALPHABET, help="value characters (default letters+digits)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_s5)


def _add_variable_assignment(sub: Any) -> None:
    p = sub.add_parser("variable-assignment", help="variable assignment chains with distractors")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--depth", type=int, default=5, help="variable-to-variable hops (default 5)")
    p.add_argument("--size", type=int, default=10000, help="training samples (default 10000)")
    p.add_argument("--eval-size", type=int, default=1000, help="eval samples (default 1000)")
    p.add_argument("--num-constants", type=int, default=3)
    p.add_argument("--num-distractors", type=int, default=2, help="distractor chains (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_variable_assignment)


def _add_prosqa(sub: Any) -> None:
    p = sub.add_parser("prosqa-hard", help="ProsQA-Hard (~60-node DAGs, ~8-step paths)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--train-size", type=int, default=10000, help="training samples (default 10000)")
    p.add_argument("--eval-size", type=int, default=500, help="eval samples (default 500)")
    p.add_argument("--nodes", type=parse_range, default=(56, 64), help="node count range (default 56-64)")
    p.add_argument("--path-len", type=parse_range, default=(7, 9), help="gold path edges range (default 7-9)")
    p.add_argument("--edge-factor", type=float, default=1.5, help="edges per node (default 1.5)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_prosqa)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``data`` command (with its task subcommands) to a main CLI's subparsers."""
    data = subparsers.add_parser("data", help="generate synthetic task datasets")
    sub = data.add_subparsers(dest="data_command", required=True, metavar="TASK")
    _add_s5(sub)
    _add_variable_assignment(sub)
    _add_prosqa(sub)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``data …`` standalone: ``python -m t2mlr.tasks.commands data s5-retrieval --out d``."""
    parser = argparse.ArgumentParser(prog="t2mlr")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    raise SystemExit(main())
