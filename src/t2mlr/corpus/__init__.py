"""Pretraining-scale corpora: tokenizing text files into memory-mapped token shards, and reading rows back.

- `tokenize_corpus(inputs, tokenizer, out_dir, workers=N)`: parquet / jsonl / jsonl.gz / txt inputs
  (paths, globs, directories, hub ids) → ``shard_*.bin`` token files, ``shard_*.offsets.npy``
  document indices and ``manifest.json``; streaming, parallel, resumable to the same bytes.
- `ShardedTokenDataset(dir, seq_len)`: the trainer's packed rows, memory-mapped from the shards.
- `prepare_offline_corpus(out_dir)` and `train_bpe_tokenizer(...)`: a real English corpus from
  Debian packages (Python documentation, the GCIDE dictionary) and a BPE tokenizer for it, for
  machines without hub access.

Bad input raises `CorpusError` (a ValueError).
"""

from t2mlr.corpus.dataset import ShardedTokenDataset
from t2mlr.corpus.errors import CorpusError
from t2mlr.corpus.offline import prepare_offline_corpus, train_bpe_tokenizer
from t2mlr.corpus.shards import read_manifest
from t2mlr.corpus.sources import resolve_inputs
from t2mlr.corpus.tokenize import tokenize_corpus

__all__ = [
    "CorpusError",
    "ShardedTokenDataset",
    "prepare_offline_corpus",
    "read_manifest",
    "resolve_inputs",
    "tokenize_corpus",
    "train_bpe_tokenizer",
]
