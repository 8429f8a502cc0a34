"""A real English corpus that needs no hub access, and a small BPE tokenizer trained on it.

Two Debian packages provide it (``apt-get install python3.11-doc dict-gcide``):

- ``python3.11-doc`` installs the Python documentation as HTML, and with it the reStructuredText
  sources Sphinx built it from, under ``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt``
  (about 500 files, 12 MB: tutorial, library and language reference, HOWTOs, what's new). One
  document per file, verbatim: technical English prose with code examples.
- ``dict-gcide`` installs the Collaborative International Dictionary of English (Webster's 1913
  plus WordNet) in dictd format: ``/usr/share/dictd/gcide.dict.dz`` (gzip-compatible, 40 MB of
  plain text) and ``gcide.index`` (headword, base64 offset, base64 length). One document per entry:
  the index's distinct byte ranges (several headwords can share one entry), in file order, without
  the ``00-database-*`` header entries. Three entries hold stray Windows-1252 bytes; they are
  skipped and counted rather than guessed at.

A third source needs no package at all: ``python-sources``, the ``*.py`` files of this Python's installed
packages (``sysconfig``'s "purelib", or any directory), one document per file. It is code, not prose, and it is
what a machine without Debian's packages or the network still has (a GPU machine's torch, jax, transformers...:
hundreds of MB). Files come in the order of a hash of their path, so the first N are a sample of every package
(a capped tokenization then trains on all of them, as the validation split is drawn from all of them); files
over 1 MB (generated tables rather than code) are left out.

The train/validation split is by document and deterministic: a document is in validation when the
sha256 of its id falls in the first `validation_fraction` of the hash range, so the split of a
document never depends on which other documents exist.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from t2mlr.corpus.errors import CorpusError

EOS = "<|endoftext|>"
PYTHON_DOCS_ROOTS = "/usr/share/doc"
GCIDE_DICT = Path("/usr/share/dictd/gcide.dict.dz")
GCIDE_INDEX = Path("/usr/share/dictd/gcide.index")
PYTHON_SOURCES_ROOT = sysconfig.get_paths()["purelib"]
MAX_SOURCE_FILE_BYTES = 1_000_000  # larger *.py files are generated data, not code
SOURCES = ("python-docs", "gcide", "python-sources")
ENGLISH_SOURCES = ("python-docs", "gcide")  # the default: English prose
INSTALL_HINT = "install them with: apt-get update && apt-get install -y python3.11-doc dict-gcide"
_BASE64 = {char: value for value, char in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def find_python_docs(root: str | os.PathLike[str] = PYTHON_DOCS_ROOTS) -> Path | None:
    """The reStructuredText sources of the newest installed python3.X-doc, or None."""
    candidates = [p for p in Path(root).glob("python3*/html/_sources") if p.is_dir()]

    def version(path: Path) -> tuple[int, ...]:
        digits = path.parts[-3].removeprefix("python").split(".")
        return tuple(int(d) for d in digits if d.isdigit())

    return max(candidates, key=version) if candidates else None


def python_doc_documents(sources_dir: Path) -> Iterator[dict[str, str]]:
    """One document per `.rst.txt` file, sorted by path."""
    for path in sorted(sources_dir.rglob("*.rst.txt")):
        relative = path.relative_to(sources_dir).as_posix().removesuffix(".rst.txt")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise CorpusError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
        if text.strip():
            yield {"id": f"python-docs/{relative}", "source": "python-docs", "text": text}


def _base64_number(text: str) -> int:
    value = 0
    for char in text:
        value = value * 64 + _BASE64[char]
    return value


def gcide_entries(index_path: Path = GCIDE_INDEX) -> list[tuple[int, int, str]]:
    """(offset, length, first headword) of every distinct entry, in file order, header entries left out."""
    headwords: dict[tuple[int, int], list[str]] = {}
    with open(index_path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise CorpusError(f"{index_path}: line {line_no}: expected headword, offset, length")
            word, offset, length = fields
            headwords.setdefault((_base64_number(offset), _base64_number(length)), []).append(word)
    return [(offset, length, words[0]) for (offset, length), words in sorted(headwords.items())
            if not all(word.startswith("00-") for word in words)]


def gcide_documents(dict_path: Path = GCIDE_DICT, index_path: Path = GCIDE_INDEX,
                    skipped: list[str] | None = None) -> Iterator[dict[str, str]]:
    """One document per dictionary entry; ids of entries that are not valid UTF-8 go to `skipped`."""
    with gzip.open(dict_path, "rb") as handle:  # dictzip is gzip with an index: a plain forward read works
        for offset, length, headword in gcide_entries(index_path):
            handle.seek(offset)
            raw = handle.read(length)
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                if skipped is not None:
                    skipped.append(f"gcide/{offset}")
                continue
            if text:
                yield {"id": f"gcide/{offset}", "source": "gcide", "title": headword, "text": text}


def _path_hash(relative: str) -> bytes:
    return hashlib.sha256(relative.encode("utf-8")).digest()


def python_source_documents(root: Path, skipped: list[str] | None = None) -> Iterator[dict[str, str]]:
    """One document per `*.py` file under `root` (caches and files over MAX_SOURCE_FILE_BYTES left out), in the
    order of a hash of the relative path; ids of files that are not valid UTF-8 go to `skipped`."""
    files = {path.relative_to(root).as_posix(): path for path in root.rglob("*.py")
             if "__pycache__" not in path.parts and path.is_file() and path.stat().st_size <= MAX_SOURCE_FILE_BYTES}
    for relative in sorted(files, key=_path_hash):
        try:
            text = files[relative].read_text(encoding="utf-8")
        except UnicodeDecodeError:
            if skipped is not None:
                skipped.append(f"python-sources/{relative}")
            continue
        if text.strip():
            yield {"id": f"python-sources/{relative}", "source": "python-sources", "text": text}


def is_validation(doc_id: str, fraction: float) -> bool:
    """Deterministic split by document id."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _jsonl_to_parquet(jsonl: Path, parquet: Path, rows_per_group: int = 8192) -> None:
    """Copy a jsonl of flat string records to parquet, a row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("title", pa.string()), ("text", pa.string())])
    temp = parquet.with_name(parquet.name + ".tmp")
    with pq.ParquetWriter(temp, schema) as writer, open(jsonl, encoding="utf-8") as handle:
        records = map(json.loads, handle)
        while rows := list(itertools.islice(records, rows_per_group)):
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    os.replace(temp, parquet)


def prepare_offline_corpus(
    out_dir: str | os.PathLike[str], sources: Iterable[str] = ENGLISH_SOURCES, validation_fraction: float = 0.02,
    parquet: bool = False, python_docs_root: str | os.PathLike[str] = PYTHON_DOCS_ROOTS,
    gcide_dict: str | os.PathLike[str] = GCIDE_DICT, gcide_index: str | os.PathLike[str] = GCIDE_INDEX,
    python_sources_root: str | os.PathLike[str] = PYTHON_SOURCES_ROOT,
) -> dict[str, Any]:
    """Write ``train.jsonl`` and ``validation.jsonl`` (``{"id", "source", "text"}`` per line; gcide
    entries also carry ``title``), optionally the same as parquet, and ``corpus.json`` with the
    counts; return those counts. `sources`: any of "python-docs", "gcide", "python-sources"."""
    sources = tuple(sources)
    unknown = set(sources) - set(SOURCES)
    if unknown or not sources:
        raise CorpusError(f"sources must be a non-empty subset of {SOURCES}, got {sources}")
    if not 0 <= validation_fraction < 1:
        raise CorpusError(f"validation_fraction must lie in [0, 1), got {validation_fraction}")
    streams: list[Iterator[dict[str, str]]] = []
    skipped: list[str] = []
    origins: dict[str, str] = {}
    if "python-docs" in sources:
        docs_dir = find_python_docs(python_docs_root)
        if docs_dir is None:
            raise CorpusError(f"no python3.X-doc sources under {python_docs_root}/python3*/html/_sources; {INSTALL_HINT}")
        origins["python-docs"] = str(docs_dir)
        streams.append(python_doc_documents(docs_dir))
    if "gcide" in sources:
        dict_path, index_path = Path(gcide_dict), Path(gcide_index)
        if not dict_path.is_file() or not index_path.is_file():
            raise CorpusError(f"GCIDE not found at {dict_path} / {index_path}; {INSTALL_HINT}")
        origins["gcide"] = str(dict_path)
        streams.append(gcide_documents(dict_path, index_path, skipped))
    if "python-sources" in sources:
        root = Path(python_sources_root)
        if not root.is_dir():
            raise CorpusError(f"python-sources: {root} is not a directory (give the folder of *.py files to read)")
        origins["python-sources"] = str(root)
        streams.append(python_source_documents(root, skipped))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = ("train", "validation")
    counts = {split: {source: {"documents": 0, "characters": 0} for source in sources} for split in splits}
    # Stream each source once, appending each document to its split's file as it comes.
    with open(out / "train.jsonl.tmp", "w", encoding="utf-8") as train, \
            open(out / "validation.jsonl.tmp", "w", encoding="utf-8") as validation:
        for stream in streams:
            for doc in stream:
                split = "validation" if is_validation(doc["id"], validation_fraction) else "train"
                (validation if split == "validation" else train).write(json.dumps(doc, ensure_ascii=False) + "\n")
                entry = counts[split][doc["source"]]
                entry["documents"] += 1
                entry["characters"] += len(doc["text"])
    for split in splits:
        os.replace(out / f"{split}.jsonl.tmp", out / f"{split}.jsonl")
        if parquet:
            _jsonl_to_parquet(out / f"{split}.jsonl", out / f"{split}.parquet")
    summary = {"origins": origins, "validation_fraction": validation_fraction, "splits": counts,
               "skipped_not_utf8": skipped,
               "documents": sum(c["documents"] for split in counts.values() for c in split.values()),
               "characters": sum(c["characters"] for split in counts.values() for c in split.values())}
    (out / "corpus.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def iter_texts(inputs: Any, text_field: str = "text") -> Iterator[str]:
    """The texts of corpus files (anything `tokenize_corpus` reads), streamed."""
    from t2mlr.corpus.sources import DocumentStream, resolve_inputs

    for text, _ in DocumentStream(resolve_inputs(inputs), text_field):
        yield text


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 8192, out_dir: str | os.PathLike[str] | None = None,
                        ) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` (GPT-2 style pre-tokenization, `<|endoftext|>` as
    eos and pad) trained on `texts` with the `tokenizers` library; saved to `out_dir` when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257:
        raise CorpusError(f"vocab_size must be at least 257 (256 bytes and {EOS}), got {vocab_size}")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=EOS)
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
