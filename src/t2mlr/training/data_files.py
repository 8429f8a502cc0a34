"""The data files a training config names, checked before torch loads: a missing, empty or unreadable file and
a line that is not a JSON object are reported at once, naming the file and its 1-based line, instead of after
the model's libraries have loaded (tens of seconds on a small machine). `t2mlr.training.data` reads the same
files with the same checks (and checks every token id once it knows the tokenizer and the vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["DataError", "check_data_files", "existing_data_file", "json_object"]


class DataError(ValueError):
    """Bad training data, said where it is: the file, the 1-based line and the field where known.

    A `ValueError`, so code that already treats bad input as one keeps working; the command line maps
    it to exit code 2 (bad input), never to 1 (which means a non-finite loss).
    """

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        if self.path is not None:
            message = f"{self.path}:{line}: {message}" if line is not None else f"{self.path}: {message}"
        super().__init__(message)


def existing_data_file(path: str | Path | None, setting: str) -> Path:
    """The data file `setting` names, refused with a DataError when it is unset, missing, a directory or empty."""
    if path is None or str(path) == "":
        raise DataError(f"{setting} is not set: name the data file to read")
    file = Path(path)
    if not file.exists():
        raise DataError(f"no such data file ({setting})", file)
    if not file.is_file():
        raise DataError(f"is not a file ({setting} must name a data file)", file)
    if file.stat().st_size == 0:
        raise DataError("the data file is empty", file)
    return file


def json_object(line: str, file: Path, line_no: int) -> dict[str, Any]:
    """One jsonl line as the JSON object it must be."""
    try:
        record = json.loads(line.rstrip("\r\n"))  # without the newline, the column is the file's column
    except json.JSONDecodeError as err:
        raise DataError(f"invalid JSON at column {err.colno}: {err.msg}", file, line_no) from err
    if not isinstance(record, dict):
        raise DataError(f"expected a JSON object, got {type(record).__name__}", file, line_no)
    return record


def check_data_files(cfg: Any) -> None:
    """Every jsonl file of a training config (`data`, `eval.data`) exists and holds one JSON object a line, and
    every shard directory exists; what the lines hold is checked when the data are read."""
    for name, data in (("data", cfg.data), ("eval.data", cfg.eval.data)):
        if data is None:
            continue
        if data.source == "jsonl":
            file = existing_data_file(data.path, f"{name}.path")
            with open(file, encoding="utf-8") as handle:
                for line_no, line in enumerate(handle, 1):
                    if line.strip():
                        json_object(line, file, line_no)
        elif data.source == "shards" and not Path(data.path).is_dir():
            raise DataError(f"{name}.path: no such shard directory", data.path)
