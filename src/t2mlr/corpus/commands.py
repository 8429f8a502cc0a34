"""Tokenize text corpora into token shards for pretraining (`data.source: shards`), and build an
English corpus that needs no hub.

examples:
  t2mlr data tokenize "data/*.parquet" --tokenizer HuggingFaceTB/SmolLM2-135M --out tokens/ --workers 8
  t2mlr corpus tokenize "data/*.parquet" ...        # the same command under the corpus group
  t2mlr corpus prepare-offline data/english --vocab 8192     # needs: apt-get install python3.11-doc dict-gcide
  t2mlr corpus train-tokenizer data/english/train.jsonl --out data/english/tokenizer --vocab 8192

tokenize streams parquet, jsonl(.gz) or txt files (memory stays flat), tokenizes in worker processes,
writes shards atomically and resumes an interrupted run in the same --out with byte-identical shards.
Exit codes: 0 done, 2 bad input (the message names the file, the line or row, and the cause).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from t2mlr.corpus.errors import CorpusError

__all__ = ["add_tokenize_parser", "main", "register"]

TOKENIZE_HELP = "tokenize parquet/jsonl/txt files (or a hub dataset) into shards"


def register(subparsers: Any) -> None:
    corpus = subparsers.add_parser("corpus", help="tokenize text corpora into memory-mapped token shards",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = corpus.add_subparsers(dest="corpus_command", required=True, metavar="COMMAND")

    add_tokenize_parser(commands)

    prep = commands.add_parser("prepare-offline", help="English corpus from the python3.11-doc and dict-gcide packages")
    prep.add_argument("out")
    prep.add_argument("--sources", default="python-docs,gcide", help="comma-separated: python-docs, gcide, python-sources (installed packages' *.py files)")
    prep.add_argument("--validation-fraction", type=float, default=0.02)
    prep.add_argument("--parquet", action="store_true", help="also write train/validation.parquet")
    prep.add_argument("--vocab", type=int, default=0, help="also train a BPE tokenizer of this size into OUT/tokenizer")
    prep.set_defaults(func=run_prepare)

    train = commands.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer on corpus files")
    train.add_argument("inputs", nargs="+")
    train.add_argument("--out", required=True)
    train.add_argument("--vocab", type=int, default=8192)
    train.add_argument("--text-field", default="text")
    train.set_defaults(func=run_train_tokenizer)


def add_tokenize_parser(commands: Any) -> argparse.ArgumentParser:
    """Add `tokenize` to a group's subparsers: `t2mlr corpus tokenize` and `t2mlr data tokenize` are this
    one parser and one handler (the CLI joins it into the `data` group, which lives in `t2mlr.tasks`)."""
    tok = commands.add_parser("tokenize", help=TOKENIZE_HELP, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    tok.add_argument("inputs", nargs="+", help="files, directories, globs (quote them) or a hub dataset id")
    tok.add_argument("--tokenizer", required=True, help="tokenizer directory, tokenizer.json or hub id")
    tok.add_argument("--out", required=True, help="output directory (an interrupted run there is resumed)")
    tok.add_argument("--workers", type=int, default=1, help="tokenizing processes (0: in the main process)")
    tok.add_argument("--text-field", default="text")
    tok.add_argument("--txt-documents", choices=("file", "paragraph"), default="file",
                     help="a .txt file is one document, or each blank-line-separated paragraph is")
    tok.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard (default 2**27)")
    tok.add_argument("--max-documents", type=int, default=None)
    tok.add_argument("--eos-token-id", type=int, default=None, help="default: the tokenizer's eos token")
    tok.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    tok.set_defaults(func=run_tokenize)
    return tok


def _report_bad_input(err: CorpusError) -> int:
    print(f"t2mlr: {err}", file=sys.stderr)
    return 2


def run_tokenize(args: argparse.Namespace) -> int:
    from t2mlr.corpus.tokenize import DEFAULT_SHARD_TOKENS, tokenize_corpus

    try:
        manifest = tokenize_corpus(
            args.inputs, args.tokenizer, args.out, workers=args.workers, text_field=args.text_field,
            txt_documents=args.txt_documents, shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS,
            max_documents=args.max_documents, eos_token_id=args.eos_token_id, overwrite=args.overwrite,
        )
    except CorpusError as err:
        return _report_bad_input(err)
    print(f"{args.out}: {manifest['num_documents']} documents, {manifest['num_tokens']} tokens "
          f"({manifest['dtype']}) in {manifest['num_shards']} shards")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from t2mlr.corpus.offline import (
        iter_texts,
        prepare_offline_corpus,
        train_bpe_tokenizer,
    )

    try:
        summary = prepare_offline_corpus(args.out, sources=args.sources.split(","),
                                         validation_fraction=args.validation_fraction, parquet=args.parquet)
        print(json.dumps(summary, indent=1))
        if args.vocab:
            train_bpe_tokenizer(iter_texts(Path(args.out) / "train.jsonl"), args.vocab, Path(args.out) / "tokenizer")
            print(f"BPE tokenizer with {args.vocab} tokens in {Path(args.out) / 'tokenizer'}")
    except CorpusError as err:
        return _report_bad_input(err)
    return 0


def run_train_tokenizer(args: argparse.Namespace) -> int:
    from t2mlr.corpus.offline import iter_texts, train_bpe_tokenizer

    try:
        train_bpe_tokenizer(iter_texts(args.inputs, args.text_field), args.vocab, args.out)
    except CorpusError as err:
        return _report_bad_input(err)
    print(f"BPE tokenizer with {args.vocab} tokens in {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m t2mlr.corpus.commands tokenize ...`: this group without the main CLI."""
    from t2mlr.utils import run_registered

    return run_registered(register, ["corpus", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
