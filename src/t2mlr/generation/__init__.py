"""Generation with T²MLR: text generation with a chosen prefill path (`text`), the `t2mlr generate`
command (`commands`), and loading saved model directories (`loading`).

The names below load on first use, so `t2mlr generate --help` and its argument errors answer before
torch and transformers are imported."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "GenerationSettings": "text",
    "ModelDirectoryError": "loading",
    "generate_kwargs": "text",
    "generate_text": "text",
    "load_model": "loading",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Load a name's module on first access (PEP 562)."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
