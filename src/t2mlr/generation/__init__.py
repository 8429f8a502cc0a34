"""Generation with T²MLR: text generation with a chosen prefill path (`text`), the `t2mlr generate`
command (`commands`), and loading saved model directories (`loading`).

The names below load on first use, so `t2mlr generate --help` and its argument errors answer before
torch and transformers are imported."""

from __future__ import annotations

from t2mlr.utils import lazy_names

_HOMES = {
    "GenerationSettings": "text",
    "ModelDirectoryError": "loading",
    "generate_kwargs": "text",
    "generate_text": "text",
    "load_model": "loading",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_names(__name__, _HOMES)
