"""`T2MLRConfig`: a base decoder's config plus the recurrence settings (SPEC §1–5).

Layer indices are 1-based and inclusive, as in the paper: T²MLR(13, 18) on a 30-block model recurs
over blocks 13..18. Every check raises a `ValueError` that names the bad value and the allowed range,
so a typo in a sweep fails at construction instead of training the wrong model.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig

RECURRENCE_PATHS = ("exact", "jacobi", "off")
RECURRENCE_MASK_POLICIES = ("all", "mask")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _as_base_config(base_config: PretrainedConfig | dict[str, Any] | None) -> PretrainedConfig | None:
    """Turn a serialised base config (a dict with `model_type`) back into its transformers class."""
    if base_config is None or isinstance(base_config, PretrainedConfig):
        return base_config
    if not isinstance(base_config, dict) or "model_type" not in base_config:
        raise ValueError("base_config must be a transformers PretrainedConfig or a dict with a 'model_type' key")
    fields = dict(base_config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


class T2MLRConfig(PretrainedConfig):
    """Configuration of a T²MLR causal LM wrapping a Hugging Face decoder.

    Args:
        base_config: config of the wrapped decoder (Llama, Mistral, Qwen2 or Qwen3 family).
        l_start, l_end: first and last block of the recurrent middle block, 1-based, inclusive.
        cache_residual: R_t = RMSNorm(h_t + R_{t-1}) when True (default), else R_t = h_t.
        gate_init_scale: multiplies the base model's `initializer_range` for the fusion linears
            f_cur, f_rec and W_rec. The scalar gates γ always start at 0, so Φ(h, r) = h at init.
        d_forward: Jacobi cache iterations (the middle block runs d_forward + 1 times).
        d_backward: how many of the most recent cache iterates carry gradients (truncated BPTT).
        train_recurrence / eval_recurrence: forward path used when `recurrence=None` in training
            and evaluation mode: "exact", "jacobi" or "off" (plain base model). Never switched silently.
        recurrence_mask_policy: "all" (every real token fuses R) or "mask" (the caller passes a
            per-token `recurrence_mask`; masked tokens skip Φ but still update the cache).
    """

    model_type = "t2mlr"

    def __init__(
        self,
        base_config: PretrainedConfig | dict[str, Any] | None = None,
        l_start: int = 1,
        l_end: int = 1,
        cache_residual: bool = True,
        gate_init_scale: float = 1.0,
        d_forward: int = 16,
        d_backward: int = 4,
        train_recurrence: str = "jacobi",
        eval_recurrence: str = "exact",
        recurrence_mask_policy: str = "all",
        **kwargs: Any,
    ) -> None:
        self.base_config = _as_base_config(base_config)
        self.l_start = l_start
        self.l_end = l_end
        self.cache_residual = cache_residual
        self.gate_init_scale = gate_init_scale
        self.d_forward = d_forward
        self.d_backward = d_backward
        self.train_recurrence = train_recurrence
        self.eval_recurrence = eval_recurrence
        self.recurrence_mask_policy = recurrence_mask_policy
        if self.base_config is not None:
            for name in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
                kwargs.setdefault(name, getattr(self.base_config, name, None))
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.validate_recurrence()

    @classmethod
    def from_base(
        cls, base_config: PretrainedConfig | dict[str, Any] | str, l_start: int, l_end: int, **kwargs: Any
    ) -> "T2MLRConfig":
        """Build a T²MLR config around a base config (object, dict or hub id / local path)."""
        if isinstance(base_config, str):
            base_config = AutoConfig.from_pretrained(base_config)
        return cls(base_config=base_config, l_start=l_start, l_end=l_end, **kwargs)

    @property
    def num_layers(self) -> int:
        return int(self.base_config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.base_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.base_config.vocab_size)

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        """Caches and generation read layer layout and vocabulary from the wrapped decoder's config."""
        return self.base_config

    def validate_recurrence(self) -> None:
        """Check every recurrence field; the message says what is wrong and what is allowed."""
        model_type = getattr(self.base_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"T²MLR cannot wrap base model type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        n = self.num_layers
        for name in ("l_start", "l_end", "d_forward", "d_backward"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= self.l_start <= self.l_end <= n:
            raise ValueError(
                f"need 1 <= l_start <= l_end <= {n} (1-based, inclusive block indices of a {n}-block model); "
                f"got l_start={self.l_start}, l_end={self.l_end}"
            )
        check_depths(self.d_forward, self.d_backward)
        for name in ("train_recurrence", "eval_recurrence"):
            check_recurrence_path(getattr(self, name), name)
        if self.recurrence_mask_policy not in RECURRENCE_MASK_POLICIES:
            raise ValueError(
                f"recurrence_mask_policy must be one of {RECURRENCE_MASK_POLICIES}, got {self.recurrence_mask_policy!r}"
            )
        if not isinstance(self.cache_residual, bool):
            raise ValueError(f"cache_residual must be a bool, got {self.cache_residual!r}")
        if not self.gate_init_scale >= 0:
            raise ValueError(f"gate_init_scale must be >= 0, got {self.gate_init_scale!r}")


def check_depths(d_forward: int, d_backward: int) -> None:
    """Jacobi depths: at least one cache iterate, and no more gradient iterates than iterates."""
    if d_forward < 1:
        raise ValueError(f"d_forward must be >= 1 (number of Jacobi cache iterations), got {d_forward}")
    if not 1 <= d_backward <= d_forward:
        raise ValueError(f"d_backward must satisfy 1 <= d_backward <= d_forward={d_forward}, got {d_backward}")


def check_recurrence_path(path: str, name: str = "recurrence") -> None:
    if path not in RECURRENCE_PATHS:
        raise ValueError(f"{name} must be one of {RECURRENCE_PATHS}, got {path!r}")
