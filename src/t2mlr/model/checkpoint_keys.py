"""The names of a saved model's tensors, today's and those of checkpoints written before 0.2.

Since 0.2 a T²MLR model is laid out as every transformers causal LM: a backbone under `model.` (the base
decoder's embedding, blocks and final norm with their usual names, plus the fusion Φ and the cache norm)
and `lm_head.` beside it. A Llama-family T²MLR checkpoint therefore holds a Llama checkpoint's tensors
under their own names, plus `model.fusion.*` and `model.cache_norm.weight`:

    model.embed_tokens.weight, model.layers.{i}.…, model.norm.weight,
    model.fusion.{f_cur,f_rec}.{weight,bias}, model.fusion.w_rec.weight, model.fusion.gamma_{cur,rec},
    model.cache_norm.weight, lm_head.weight (absent when tied to the embedding)

Up to 0.1 the wrapped decoder sat whole under `base.` and the recurrence's modules at the top
(`base.model.layers.0…`, `base.lm_head.weight`, `fusion.…`, `cache_norm.weight`); the looped and
pause-token baselines used the same `base.` prefix. `current_key` renames such a key, and
`LEGACY_KEY_MAPPING` is the same rule in the form `from_pretrained(key_mapping=...)` takes, so old
checkpoints keep loading.
"""

from __future__ import annotations

import re

# (old prefix, new prefix), first match wins; a key that matches none is already current.
LEGACY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("base.model.", "model."),
    ("base.lm_head.", "lm_head."),
    ("fusion.", "model.fusion."),
    ("cache_norm.", "model.cache_norm."),
    ("pause_embeddings.", "model.pause_embeddings."),
)

LEGACY_KEY_MAPPING: dict[str, str] = {"^" + re.escape(old): new for old, new in LEGACY_PREFIXES}


def current_key(name: str) -> str:
    """Today's name of a saved tensor, whether `name` is a 0.1 name or already current."""
    for old, new in LEGACY_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def is_legacy(names: list[str] | tuple[str, ...] | set[str]) -> bool:
    """Whether a checkpoint's tensor names are the 0.1 layout (any name that `current_key` renames)."""
    return any(current_key(name) != name for name in names)
