"""Throughput and memory of `t2mlr.corpus.tokenize_corpus`, against the tokenizer's own batch throughput.

Throughput (always): the same texts (the first --mb MB of the corpus) are tokenized, alternately, by
- the limit: N processes that only call the tokenizer on batches of --batch-chars characters
  (`tokenizer(texts, add_special_tokens=False, ...)`, exactly the call the pipeline's workers make),
  the texts already in memory, timed from a barrier to the last process's end;
- the pipeline: `tokenize_corpus(jsonl, tokenizer, out, workers=N)`, wall clock of the whole call
  (reading and parsing the jsonl, worker start, IPC, shard writes and fsyncs included).
Both use one tokenizer thread per process (TOKENIZERS_PARALLELISM=false), N from --workers; the
table gives tokens/s of each and the median of the per-pair ratios (pipeline / limit).

Memory (--memory): builds parquet files of --sizes-gb GB in --work (the corpus repeated, each row
made unique by an id prefix; large row groups, snappy), then in a fresh subprocess each
- tokenizes the first --max-documents rows (2 workers) and records peak RSS of the main process and
  of the largest worker (getrusage), and
- streams through every row of the file with the reader alone (no tokenizer), recording peak RSS,
and deletes the files. Peak RSS that stays flat as the file and the amount processed grow is the
point: nothing is read whole.

Corpus and tokenizer: --corpus (a jsonl of {"text"}) and --tokenizer (a directory), else the offline
English corpus (`prepare_offline_corpus`: apt-get install python3.11-doc dict-gcide) and an 8192-token
BPE trained on it, built once into --work.

    python benchmarks/tokenize_throughput.py --workers 1,2 --mb 16 --repeats 3
    python benchmarks/tokenize_throughput.py --memory --sizes-gb 1,4 --max-documents 100000,400000
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from t2mlr.utils import parse_int_list
from t2mlr.analysis.benchmarking import machine_info, print_report

# ---------------------------------------------------------------------------------------------
# Corpus, tokenizer, texts


def ensure_corpus(work: Path, corpus: Path | None, tokenizer: Path | None, vocab: int) -> tuple[Path, Path]:
    """(jsonl of texts, tokenizer directory): the given ones, or the offline corpus and a BPE built once."""
    from t2mlr.corpus import prepare_offline_corpus, train_bpe_tokenizer
    from t2mlr.corpus.offline import iter_texts

    if corpus is None:
        corpus = work / "offline" / "train.jsonl"
        if not corpus.is_file():
            print(f"preparing the offline corpus in {corpus.parent} ...", flush=True)
            prepare_offline_corpus(corpus.parent)
    if tokenizer is None:
        tokenizer = work / f"bpe{vocab}"
        if not (tokenizer / "tokenizer.json").is_file():
            print(f"training a {vocab}-token BPE on {corpus} ...", flush=True)
            train_bpe_tokenizer(iter_texts(corpus), vocab, tokenizer)
    return corpus, tokenizer


def first_texts(corpus: Path, megabytes: float) -> list[str]:
    """Texts from the start of the corpus up to `megabytes` MB of characters."""
    from t2mlr.corpus.offline import iter_texts

    texts, chars = [], 0
    for text in iter_texts(corpus):
        if chars >= megabytes * 1e6:
            break
        texts.append(text)
        chars += len(text)
    return texts


def batches_of(texts: list[str], batch_chars: int) -> list[list[str]]:
    """The batches the pipeline forms: consecutive texts up to `batch_chars` characters."""
    batches, batch, chars = [], [], 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if chars >= batch_chars or len(batch) >= 4096:
            batches.append(batch)
            batch, chars = [], 0
    if batch:
        batches.append(batch)
    return batches


# ---------------------------------------------------------------------------------------------
# Throughput: limit vs pipeline


def _limit_worker(tokenizer: Any, batches: list[list[str]], barrier: Any, results: Any) -> None:
    barrier.wait()
    start = time.perf_counter()
    tokens = 0
    for batch in batches:
        ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False,
                        return_token_type_ids=False)["input_ids"]
        tokens += sum(len(doc) + 1 for doc in ids)  # + EOS, as the shards count them
    results.put((tokens, time.perf_counter() - start))


def limit_throughput(tokenizer: Any, batches: list[list[str]], processes: int) -> tuple[int, float]:
    """(tokens, seconds) of `processes` forked processes tokenizing contiguous shares of the batches."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    share = -(-len(batches) // processes)
    workers = [context.Process(target=_limit_worker, args=(tokenizer, batches[i * share:(i + 1) * share],
                                                          barrier, results)) for i in range(processes)]
    for worker in workers:
        worker.start()
    barrier.wait()
    outcomes = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return sum(t for t, _ in outcomes), max(s for _, s in outcomes)


def pipeline_throughput(source: Path, tokenizer: Any, out: Path, workers: int, batch_chars: int) -> tuple[int, float]:
    from t2mlr.corpus import tokenize_corpus

    start = time.perf_counter()
    manifest = tokenize_corpus(source, tokenizer, out, workers=workers, batch_chars=batch_chars, overwrite=True,
                               progress=False)
    return manifest["num_tokens"], time.perf_counter() - start


def throughput_rows(args: argparse.Namespace, corpus: Path, tokenizer: Any) -> list[list[object]]:
    texts = first_texts(corpus, args.mb)
    source = args.work / "throughput.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    batches = batches_of(texts, args.batch_chars)
    rows = []
    for workers in args.workers:
        limits, pipelines = [], []
        for repeat in range(args.repeats):  # alternate which runs first (ABBA)
            order = ("limit", "pipeline") if repeat % 2 == 0 else ("pipeline", "limit")
            for kind in order:
                if kind == "limit":
                    limits.append(limit_throughput(tokenizer, batches, workers))
                else:
                    pipelines.append(pipeline_throughput(source, tokenizer, args.work / "throughput_out", workers,
                                                         args.batch_chars))
        assert all(t == limits[0][0] for t, _ in limits + pipelines), "limit and pipeline counted different tokens"
        limit_rates = [t / s for t, s in limits]
        pipe_rates = [t / s for t, s in pipelines]
        ratio = statistics.median(p / q for p, q in zip(pipe_rates, limit_rates))
        rows.append([workers, f"{len(texts)} docs, {sum(map(len, texts)) / 1e6:.1f} MB, {limits[0][0]:,} tokens",
                     f"{statistics.median(limit_rates):,.0f}", f"{statistics.median(pipe_rates):,.0f}",
                     f"{ratio:.2f}", f"{min(p / q for p, q in zip(pipe_rates, limit_rates)):.2f}"])
    shutil.rmtree(args.work / "throughput_out", ignore_errors=True)
    return rows


# ---------------------------------------------------------------------------------------------
# Memory: big parquet files, measured in fresh subprocesses


def write_big_parquet(path: Path, corpus_texts: list[str], gigabytes: float, rows_per_group: int = 262_144) -> int:
    """Repeat the texts, each row prefixed by a unique id, until the file holds `gigabytes` GB; row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    rows, target = 0, gigabytes * 1e9
    cycle = itertools.cycle(corpus_texts)
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        while not path.exists() or path.stat().st_size < target:
            ids = list(range(rows, rows + rows_per_group))
            texts = [f"[document {i}] {next(cycle)}" for i in ids]
            writer.write_table(pa.table({"id": ids, "text": texts}, schema=schema), row_group_size=rows_per_group)
            rows += rows_per_group
    return rows


def measure_in_subprocess(mode: str, path: Path, tokenizer_dir: Path, out: Path, max_documents: int, workers: int,
                          ) -> dict[str, Any]:
    """Run `--measure MODE` in a fresh interpreter (peak RSS counters start from zero there)."""
    command = [sys.executable, __file__, "--measure", mode, "--measure-input", str(path), "--tokenizer",
               str(tokenizer_dir), "--measure-out", str(out), "--max-documents", str(max_documents),
               "--workers", str(workers)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_rss_mib(pid: int | str = "self") -> float:
    """VmHWM (peak resident set) of a process from /proc, MiB. Not getrusage: on Linux its ru_maxrss
    survives exec, so a child started by a big parent would report the parent's size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


class ChildPeakSampler:
    """Polls the peak RSS of this process's children (the tokenizer workers) while they live."""

    def __init__(self, interval: float = 0.1) -> None:
        import threading

        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _children(self) -> list[str]:
        me, found = str(os.getpid()), []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                        found.append(entry.name)
                except OSError:
                    continue
        return found

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for pid in self._children():
                try:
                    self.peak = max(self.peak, peak_rss_mib(pid))
                except (OSError, RuntimeError):
                    continue

    def __enter__(self) -> ChildPeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(mode: str, path: Path, tokenizer_dir: Path, out: Path, max_documents: int, workers: int) -> dict[str, Any]:
    """Peak RSS (MiB) of this process and of its largest child around one tokenization or one read."""
    from t2mlr.corpus import tokenize_corpus
    from t2mlr.corpus.sources import DocumentStream, resolve_inputs

    baseline = peak_rss_mib()
    start = time.perf_counter()
    with ChildPeakSampler() as children:
        if mode == "tokenize":
            manifest = tokenize_corpus(path, str(tokenizer_dir), out, workers=workers, max_documents=max_documents,
                                       overwrite=True, progress=False)
            documents, tokens, characters = manifest["num_documents"], manifest["num_tokens"], None
            shutil.rmtree(out, ignore_errors=True)
        else:
            documents, tokens, characters = 0, None, 0
            for text, _ in DocumentStream(resolve_inputs(path)):
                documents += 1
                characters += len(text)
    return {"mode": mode, "documents": documents, "tokens": tokens, "characters": characters,
            "seconds": time.perf_counter() - start, "rss_after_imports_mib": baseline,
            "peak_rss_mib": peak_rss_mib(), "peak_child_rss_mib": children.peak}


def memory_rows(args: argparse.Namespace, corpus: Path, tokenizer_dir: Path) -> list[list[object]]:
    texts = first_texts(corpus, 1e9)
    rows = []
    for gigabytes in args.sizes_gb:
        path = args.work / f"big_{gigabytes:g}gb.parquet"
        try:
            count = write_big_parquet(path, texts, gigabytes)
            size = path.stat().st_size / 1e9
            runs = [("tokenize", n) for n in args.max_documents] + [("read", 1)]  # read: every row
            for mode, limit in runs:
                result = measure_in_subprocess(mode, path, tokenizer_dir, args.work / "memory_out", limit, 2)
                what = (f"tokenize first {result['documents']:,} rows (2 workers), {result['tokens']:,} tokens"
                        if mode == "tokenize" else
                        f"read all {result['documents']:,} rows ({result['characters'] / 1e9:.2f} G chars), no tokenizer")
                rows.append([f"{size:.2f} GB, {count:,} rows", what, f"{result['seconds']:.0f}",
                             f"{result['rss_after_imports_mib']:.0f}", f"{result['peak_rss_mib']:.0f}",
                             f"{result['peak_child_rss_mib']:.0f}" if mode == "tokenize" else "-"])
                print(rows[-1], flush=True)
        finally:
            path.unlink(missing_ok=True)
    return rows


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/t2mlr_tokenize_bench"))
    p.add_argument("--corpus", type=Path, default=None, help="jsonl of {'text'} (default: the offline corpus)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: BPE on the corpus)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--workers", type=parse_int_list, default=[1, 2])
    p.add_argument("--mb", type=float, default=16.0, help="MB of text for the throughput runs")
    p.add_argument("--batch-chars", type=int, default=1 << 20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the tokenizer uses one per process)")
    p.add_argument("--memory", action="store_true", help="also run the big-parquet memory measurement")
    p.add_argument("--sizes-gb", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 4.0])
    p.add_argument("--max-documents", type=parse_int_list, default=[100_000, 400_000])
    p.add_argument("--measure", choices=("tokenize", "read"), help=argparse.SUPPRESS)
    p.add_argument("--measure-input", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--measure-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one tokenizer thread per process, here and in children
    if args.measure:
        print(json.dumps(measure(args.measure, args.measure_input, args.tokenizer, args.measure_out,
                                 args.max_documents[0], args.workers[0])))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer_dir = ensure_corpus(args.work, args.corpus, args.tokenizer, args.vocab)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    info = machine_info(torch.device("cpu"))
    info["tokenizer"] = f"{tokenizer_dir} ({len(tokenizer)} tokens, {type(tokenizer).__name__})"
    info["corpus"] = str(corpus)
    print_report("Tokenization throughput: tokenize_corpus vs the tokenizer's own batch calls", info,
                 "tokenize_throughput.py", argv,
                 ["workers", "texts", "limit tok/s", "pipeline tok/s", "ratio (median)", "ratio (worst)"],
                 throughput_rows(args, corpus, tokenizer))
    if args.memory:
        print_report("Peak memory while streaming big parquet files", info, "tokenize_throughput.py", argv,
                     ["input", "run", "seconds", "RSS after imports MiB", "peak RSS main MiB",
                      "peak RSS largest worker MiB"], memory_rows(args, corpus, tokenizer_dir))


if __name__ == "__main__":
    main()
