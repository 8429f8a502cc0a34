"""Pretraining-scale corpora: tokenizing text files into memory-mapped token shards, and reading rows back.

- `tokenize_corpus(inputs, tokenizer, out_dir, workers=N)`: parquet / jsonl / jsonl.gz / txt inputs
  (paths, globs, directories, hub ids) → ``shard_*.bin`` token files, ``shard_*.offsets.npy``
  document indices and ``manifest.json``; streaming, parallel, resumable to the same bytes.
- `ShardedTokenDataset(dir, seq_len)`: the trainer's packed rows, memory-mapped from the shards.
- `prepare_offline_corpus(out_dir)` and `train_bpe_tokenizer(...)`: a real English corpus from
  Debian packages (Python documentation, the GCIDE dictionary) and a BPE tokenizer for it, for
  machines without hub access.

Bad input raises `CorpusError` (a ValueError).

The names load from their modules on first use (PEP 562, as in ``t2mlr``), so the ``t2mlr corpus`` and
``t2mlr data`` commands' help does not import torch.
"""

from t2mlr.corpus.errors import CorpusError
from t2mlr.utils import lazy_names

_LAZY = {
    "ShardedTokenDataset": "dataset",
    "prepare_offline_corpus": "offline",
    "train_bpe_tokenizer": "offline",
    "read_manifest": "shards",
    "resolve_inputs": "sources",
    "tokenize_corpus": "tokenize",
}

__all__ = [
    "CorpusError",
    "ShardedTokenDataset",
    "prepare_offline_corpus",
    "read_manifest",
    "resolve_inputs",
    "tokenize_corpus",
    "train_bpe_tokenizer",
]


__getattr__ = lazy_names(__name__, _LAZY)
