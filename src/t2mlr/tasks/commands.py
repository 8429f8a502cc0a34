"""``t2mlr data …``: command-line generation of the synthetic task datasets.

The main CLI calls ``register(subparsers)``; every leaf parser sets ``func`` (``args → exit
code``), so the caller runs ``args.func(args)``. ``main(argv)`` runs this group on its own.

Each command writes ``train.jsonl``, ``eval.jsonl`` and ``meta.json`` (the settings used) into
``--out`` (S5-Retrieval also writes the word-level tokenizer to ``tokenizer/``) and prints every
path it wrote; ``hotpotqa-cot`` builds ``train.jsonl`` and ``test.jsonl`` from local HotpotQA files and
chain-of-thought traces instead (``t2mlr.tasks.hotpotqa``). Eval sets use random streams independent of the training stream; for variable
assignment and ProsQA-Hard, eval samples whose prompt also occurs in the training set are
dropped (S5 dictionaries are drawn fresh per sequence, so collisions are negligible there).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from t2mlr.tasks.jsonl import write_jsonl
from t2mlr.tasks.prosqa import iter_prosqa_hard
from t2mlr.tasks.s5_retrieval import DEFAULT_ALPHABET, iter_s5_eval, iter_s5_retrieval
from t2mlr.tasks.variable_assignment import iter_variable_assignment

__all__ = ["main", "parse_range", "register"]

Handler = Callable[[argparse.Namespace], int]


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


def _one_line_errors(handler: Handler) -> Handler:
    """Bad settings (a ValueError from a generator) or a missing input file end the command with one line on
    stderr and exit code 2, whichever command line runs it (`t2mlr data …` or this module's `main`)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, FileNotFoundError) as err:
            print(f"t2mlr data {args.data_command}: error: {err}", file=sys.stderr)
            return 2

    return run


def _progress(samples: Iterable[dict[str, Any]], total: int, desc: str) -> Iterator[dict[str, Any]]:
    """A progress bar on stderr (stdout keeps only the list of written files) around a sample stream."""
    return iter(tqdm(samples, total=total, desc=desc, unit=" samples", dynamic_ncols=True, file=sys.stderr))


def _write(records: Iterable[dict[str, Any]], path: Path) -> None:
    count = write_jsonl(records, path)
    print(f"wrote {count} samples to {path}")


def _write_meta(out: Path, args: argparse.Namespace) -> None:
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    path = out / "meta.json"
    path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote settings to {path}")


def _disjoint_eval(stream: Iterator[dict[str, Any]], size: int, train_keys: set[str], key: str) -> list[dict[str, Any]]:
    """The first ``size`` samples of an endless eval stream whose ``key`` is not in training.

    Draws at most 16 × size samples before giving up (too few differ from the training set).
    """
    kept: list[dict[str, Any]] = []
    if size <= 0:
        return kept
    with tqdm(total=size, desc="eval", unit=" samples", dynamic_ncols=True, file=sys.stderr) as bar:
        for sample in itertools.islice(stream, 16 * size):
            if sample[key] not in train_keys:
                kept.append(sample)
                bar.update(1)
                if len(kept) == size:
                    return kept
    raise ValueError(f"only {len(kept)} eval samples differ from the training set; lower --eval-size")


def _write_disjoint_splits(args: argparse.Namespace, stream: Callable[[int | None, str], Iterator[dict[str, Any]]],
                           train_size: int, key: str) -> int:
    """train.jsonl (`train_size` samples of the "train" stream), eval.jsonl (samples of the endless "eval" stream
    whose `key` no training sample has) and meta.json under --out."""
    train_stream, eval_stream = stream(train_size, "train"), stream(None, "eval")  # settings checked here
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train = list(_progress(train_stream, train_size, "train"))
    _write(train, out / "train.jsonl")
    _write(_disjoint_eval(eval_stream, args.eval_size, {s[key] for s in train}, key), out / "eval.jsonl")
    _write_meta(out, args)
    return 0


@_one_line_errors
def _run_s5(args: argparse.Namespace) -> int:
    # Both streams check every setting on the call, before anything is written.
    train = iter_s5_retrieval(
        args.train_size, args.train_n, args.k, args.dict_size, args.seed, args.alphabet, stream="train"
    )
    evals = iter_s5_eval(args.eval_size, args.eval_n, args.k, args.dict_size, args.seed, args.alphabet)
    # imported here: transformers loads only when a tokenizer is written, not for `t2mlr data --help`
    from t2mlr.tasks.tokenizers import build_s5_tokenizer

    tokenizer = build_s5_tokenizer(args.k, args.alphabet)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    print(f"wrote tokenizer to {out / 'tokenizer'}")
    _write(_progress(train, args.train_size, "train"), out / "train.jsonl")
    eval_total = args.eval_size * (args.eval_n[1] - args.eval_n[0] + 1)
    _write(_progress(evals, eval_total, "eval"), out / "eval.jsonl")
    _write_meta(out, args)
    return 0


@_one_line_errors
def _run_variable_assignment(args: argparse.Namespace) -> int:
    def stream(count: int | None, name: str) -> Iterator[dict[str, Any]]:
        mixed = args.min_depth if name == "train" else None  # evaluation stays at --depth
        return iter_variable_assignment(count, args.depth, args.num_constants, args.num_distractors, args.seed, name,
                                        mixed)

    return _write_disjoint_splits(args, stream, args.size, "prompt")


@_one_line_errors
def _run_prosqa(args: argparse.Namespace) -> int:
    def stream(count: int | None, name: str) -> Iterator[dict[str, Any]]:
        return iter_prosqa_hard(count, args.nodes, args.path_len, args.edge_factor, args.seed, name, args.name_pool)

    return _write_disjoint_splits(args, stream, args.train_size, "question")


@_one_line_errors
def _run_hotpotqa_cot(args: argparse.Namespace) -> int:
    from t2mlr.tasks.hotpotqa import build_hotpotqa_cot, write_hotpotqa_cot

    if args.eval_size is not None and args.eval_size < 1:
        raise ValueError(f"--eval-size must be >= 1, got {args.eval_size}")
    build = build_hotpotqa_cot(args.hotpotqa_train, args.traces, args.hotpotqa_eval, args.eval_size, args.keep_wrong)
    sources = {k: v for k, v in vars(args).items() if k not in ("func", "out")}
    for path in write_hotpotqa_cot(build, args.out, sources):
        print(f"wrote {path}")
    print(f"{len(build.train)} training records ({build.no_trace} questions without a trace, {build.no_answer_in_trace} "
          f"traces stating no answer, {build.wrong_answer} stating a wrong one, {build.kept_wrong} of those kept); "
          f"{len(build.test)} evaluation records")
    return 0


def _add_hotpotqa_cot(sub: Any) -> None:
    p = sub.add_parser("hotpotqa-cot", help="HotpotQA with chain-of-thought traces, for `experiment finetune hotpotqa`",
                       description="Join local HotpotQA files with chain-of-thought traces (the paper's are not public; "
                                   "any file in their form works) into train.jsonl and test.jsonl. See "
                                   "t2mlr.tasks.hotpotqa for the formats and rules.")
    p.add_argument("--hotpotqa-train", type=Path, required=True,
                   help="HotpotQA training questions (.jsonl/.parquet in the hub's columns, or the release's .json)")
    p.add_argument("--traces", type=Path, required=True,
                   help="traces (.jsonl/.parquet): id or question, and the reasoning in 'output' or 'steps', ending "
                        "in \\boxed{answer}")
    p.add_argument("--hotpotqa-eval", type=Path, required=True, help="HotpotQA evaluation questions (e.g. the dev set)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--eval-size", type=int, default=None, help="keep the first N evaluation questions (default: all)")
    p.add_argument("--keep-wrong", action="store_true", help="keep traces whose answer is wrong (default: leave them out)")
    p.set_defaults(func=_run_hotpotqa_cot)


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
    p.add_argument("--min-depth", type=int, default=None,
                   help="training samples draw their depth from MIN_DEPTH..DEPTH (evaluation stays at --depth)")
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
    p.add_argument("--name-pool", type=int, default=None,
                   help="draw concept names from one fixed list of this many (default: fresh names per sample)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_prosqa)


def register(subparsers: Any, joined: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """Add the ``data`` command (with its task subcommands) to a main CLI's subparsers.

    ``joined``: functions of other parts on this layer that add their own subcommands to the group (the
    CLI passes ``t2mlr.corpus``'s ``tokenize``), so the group gathers them without a sideways import.
    """
    data = subparsers.add_parser("data", help="generate synthetic task datasets; tokenize corpora")
    sub = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    _add_s5(sub)
    _add_variable_assignment(sub)
    _add_prosqa(sub)
    _add_hotpotqa_cot(sub)
    for add_subcommands in joined:
        add_subcommands(sub)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``data …`` standalone: ``python -m t2mlr.tasks.commands data s5-retrieval --out d``.

    Returns 0 when done; bad settings print one line and exit with code 2 (SystemExit, as argparse
    does for bad arguments).
    """
    from t2mlr.utils import run_registered

    code = run_registered(register, argv)
    if code:
        raise SystemExit(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
