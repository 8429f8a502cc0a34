"""Named base-model shapes, built from their published configs without any download.

The paper's backbone is SmolLM2-135M: 30 blocks, hidden 576, 9 heads of 64 with 3 key-value heads,
MLP 1536, a 49152-token vocabulary and tied embeddings. Parameter matching, the benchmarks, the
baselines' presets and the experiments all start from these shapes, so they are defined once, here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import LlamaConfig

from .configuration import T2MLRConfig

SMOLLM2_VOCAB = 49152


def smollm2_135m_base_config(**overrides: Any) -> LlamaConfig:
    """SmolLM2-135M (the paper's backbone); keyword arguments override fields."""
    fields: dict[str, Any] = dict(
        vocab_size=SMOLLM2_VOCAB,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        initializer_range=0.041666666666666664,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def smollm2_360m_base_config(**overrides: Any) -> LlamaConfig:
    """SmolLM2-360M: 32 blocks, hidden 960, 15 heads of 64 with 5 key-value heads, MLP 2560."""
    fields: dict[str, Any] = dict(
        hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, head_dim=64, initializer_range=0.02,
    )
    return smollm2_135m_base_config(**{**fields, **overrides})


def smollm2_1b_base_config(**overrides: Any) -> LlamaConfig:
    """The ~1B backbone of the paper's scaling table: SmolLM2-1.7B's layout (24 blocks, as many key-value
    heads as heads, MLP 4 × hidden) at hidden 1536, 24 heads of 64, MLP 6144.

    Why this shape: the paper does not print its 1B config; this one has exactly the 981.5M parameters
    the paper gives for its 1B T²MLR (981,542,400 with the 49152-token tied vocabulary), as
    SmolLM2-360M has exactly the 361.8M it gives at 361M; both counts are the backbone's, the fusion
    not included. It has the 24 blocks that the paper's placement T²MLR(9,24) needs.
    """
    fields: dict[str, Any] = dict(
        hidden_size=1536, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=24,
        num_key_value_heads=24, head_dim=64, initializer_range=0.02,
    )
    return smollm2_135m_base_config(**{**fields, **overrides})


def smollm2_shaped_config(hidden: int = 576, **overrides: Any) -> LlamaConfig:
    """SmolLM2-135M's proportions at another width: heads of 64, 3:1 grouped-query attention where the
    head count allows it, MLP 8/3 × hidden. hidden=576 is exactly the 135M shape."""
    heads = max(1, hidden // 64)
    fields: dict[str, Any] = dict(
        hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_attention_heads=heads,
        num_key_value_heads=heads // 3 if heads % 3 == 0 else heads, head_dim=hidden // heads,
    )
    return smollm2_135m_base_config(**{**fields, **overrides})


SHAPES: dict[str, Callable[..., LlamaConfig]] = {
    "smollm2-135m": smollm2_135m_base_config,
    "smollm2-360m": smollm2_360m_base_config,
    "smollm2-1b": smollm2_1b_base_config,
}


def base_config_for_shape(name: str, **overrides: Any) -> LlamaConfig:
    """The base config of a named shape (see `SHAPES`)."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[name](**overrides)


def smollm2_135m_t2mlr_config(l_start: int = 13, l_end: int = 18, **settings: Any) -> T2MLRConfig:
    """T²MLR(l_start, l_end) on the SmolLM2-135M shape (the paper's main placement by default)."""
    return T2MLRConfig.from_base(smollm2_135m_base_config(), l_start=l_start, l_end=l_end, **settings)
