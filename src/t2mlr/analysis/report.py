"""Writing a result, the same way for every analysis and experiment: OUT/<stem>.md (the table and the words
around it) beside OUT/<stem>.json (every number), plus the number formats the tables share.

JSON gets what `json` cannot hold spelt out: a non-finite float as its name ("nan", "inf"), a path as its
string, mapping keys as strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "minutes", "optimizer_settings", "percent", "table", "write_result"]

TABLE_SUFFIX, JSON_SUFFIX = ".md", ".json"


def write_result(out_dir: str | Path, stem: str, markdown: Sequence[str], payload: dict[str, Any],
                 markdown_stem: str | None = None) -> tuple[Path, Path]:
    """OUT/stem.md (the lines given; `markdown_stem` names it otherwise, e.g. README for a folder's front page)
    and OUT/stem.json (the payload); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{markdown_stem or stem}{TABLE_SUFFIX}", out / f"{stem}{JSON_SUFFIX}"
    md.write_text("\n".join(markdown).rstrip() + "\n", encoding="utf-8")
    js.write_text(json.dumps(_json_safe(payload), indent=2) + "\n", encoding="utf-8")
    return md, js


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """`align` has one letter per column, "l" (left) or "r" (right, for numbers); empty: every column left."""
    align = align or "l" * len(headers)
    if len(align) != len(headers) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: one letter, l or r, for each of the {len(headers)} columns")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> list[str]:
    """A markdown table as lines (`align` as for `markdown_table`)."""
    return markdown_table(headers, rows, align).splitlines()


def percent(value: float, digits: int = 1, sign: str = "%") -> str:
    """0.256 → "25.6%"."""
    return f"{100 * value:.{digits}f}{sign}"


def minutes(seconds: float) -> str:
    """A duration as minutes from one minute on, else seconds: "3.5 min", "42 s"."""
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def optimizer_settings(tree: Mapping[str, Any], batch: int) -> str:
    """The optimizer, schedule and batch of a trainer config tree in words, as the experiments' reports state them:
    "AdamW (lr …, betas …, weight decay …), N warmup steps then cosine to X× lr, batch B"."""
    optim, schedule = tree["optim"], tree["schedule"]
    return (f"AdamW (lr {optim['lr']:g}, betas {tuple(optim['betas'])}, weight decay {optim['weight_decay']:g}), "
            f"{schedule['warmup_steps']} warmup steps then cosine to {schedule['min_lr_ratio']:g}× lr, batch {batch}")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
