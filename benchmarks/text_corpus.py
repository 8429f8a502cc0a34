"""A small offline text corpus and BPE tokenizer, to train a checkpoint for benchmarks that need one.

Why: early stopping of the Jacobi iterations (benchmarks/train_overhead.py --checkpoint) only pays
off on a trained model, whose cache converges; random weights say nothing about it. No hub data can
be downloaded on the CPU machines, so the corpus is the Python interpreter's own standard library
source (`*.py` under `sysconfig` "stdlib", its test suites left out), which every machine has. It
is code, not prose, but it is real text with long-range structure; the file list is sorted and
capped, so a given Python version always yields the same corpus.

Writes to OUT:
    train.jsonl, eval.jsonl   {"text": <one source file>} per line (eval: every 50th file)
    tokenizer/                a byte-level BPE `PreTrainedTokenizerFast` (vocab --vocab, eos <|endoftext|>)

    python benchmarks/text_corpus.py --out data/stdlib            # then: t2mlr train configs/overhead_cpu.yaml ...
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
EVAL_EVERY = 50


def source_files(root: Path, max_bytes: int) -> list[Path]:
    """Sorted `*.py` files under root, skipping test suites and installed packages, up to max_bytes."""
    skipped = {"test", "tests", "site-packages", "idle_test", "__pycache__"}
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if skipped & set(path.relative_to(root).parts):
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            break
        chosen.append(path)
        total += size
    if not chosen:
        raise FileNotFoundError(f"no *.py files found under {root}")
    return chosen


def write_split(paths: list[Path], out: Path) -> int:
    with open(out, "w", encoding="utf-8") as handle:
        for path in paths:
            handle.write(json.dumps({"text": path.read_text(encoding="utf-8", errors="replace")}) + "\n")
    return len(paths)


def train_tokenizer(paths: list[Path], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style pre-tokenisation) trained on the given files."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(p) for p in paths], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                   help="directory of text (*.py) files (default: this Python's standard library)")
    p.add_argument("--max-mb", type=float, default=16.0, help="cap on the corpus size")
    p.add_argument("--vocab", type=int, default=4096)
    args = p.parse_args(argv)
    paths = source_files(args.source, int(args.max_mb * 2**20))
    train_paths = [path for i, path in enumerate(paths) if i % EVAL_EVERY]
    eval_paths = paths[::EVAL_EVERY]
    args.out.mkdir(parents=True, exist_ok=True)
    n_train = write_split(train_paths, args.out / "train.jsonl")
    n_eval = write_split(eval_paths, args.out / "eval.jsonl")
    train_tokenizer(train_paths, args.vocab).save_pretrained(str(args.out / "tokenizer"))
    size_mb = sum(p.stat().st_size for p in paths) / 2**20
    print(f"{args.out}: {n_train} training and {n_eval} evaluation files ({size_mb:.1f} MB) from {args.source}; "
          f"tokenizer with {args.vocab} tokens")


if __name__ == "__main__":
    main()
