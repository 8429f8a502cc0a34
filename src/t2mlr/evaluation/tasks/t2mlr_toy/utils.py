"""Loader of the toy task's data: a jsonl beside this file, so the task runs offline from any directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

DATA_FILE = Path(__file__).resolve().parent / "toy.jsonl"


def load_toy(**_metadata: Any) -> datasets.DatasetDict:
    """The toy questions as a "test" split (lm-eval passes task metadata as keywords; none is used)."""
    with DATA_FILE.open(encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(records)})
