"""JSON-lines reading and writing shared by every task generator, and reading the local copies of published
datasets (JSON lines or parquet, the forms the hub serves them in)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


def write_jsonl(records: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write one JSON object per line (UTF-8, parents created); return the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False))
            f.write("\n")
            count += 1
    return count


def numbered_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSON-lines file, so a caller that checks the records
    can name a bad one's line; the line number is in any parse error."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file, skipping blank lines; the line number is in any parse error."""
    return [record for _, record in numbered_jsonl(path)]


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local dataset file: parquet (`.parquet`) or JSON lines (any other name), as dicts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # imported here: only parquet files need it

        return pq.read_table(path).to_pylist()
    return read_jsonl(path)
