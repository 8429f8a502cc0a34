"""`T2MLRConfig`: a base decoder's config plus the recurrence settings, and the forward-path decision.

Layer indices are 1-based and inclusive, as in the paper: T²MLR(13, 18) on a 30-block model recurs
over blocks 13..18 (docs/semantics.md §1). The recurrence settings, their schema and their checks are pure
data in `t2mlr.settings` (`T2MLRSettings`): the config takes its fields from there, and the trainer's YAML
`model:` section, `T2MLRConfig.from_base` and `T2MLRForCausalLM.from_base` are all checked against it, so a
misspelt setting fails with the nearest valid name instead of silently keeping its default.

`T2MLRConfig.forward_path(...)` is the one place that decides which path a forward call takes: the
explicit argument if given, else the config's training or evaluation field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from transformers import AutoConfig, PretrainedConfig

from t2mlr.model.remote_code import AUTO_MAP
from t2mlr.settings import (
    RECURRENCE_MASK_POLICIES,
    SUPPORTED_MODEL_TYPES,
    ExactSolver,
    RecurrencePath,
    T2MLRSettings,
    check_block_range,
    check_bptt_window,
    check_cache_update,
    check_depths,
    check_exact_solver,
    check_fusion,
    check_jacobi_tol,
    check_recurrence_path,
    settings_fields,
    take_settings,
)
from t2mlr.utils import Field, check_known_names, keyword_parameters, unknown_name_message

# ---------------------------------------------------------------------------------------------- base configs


def known_config_keys(config_class: type[PretrainedConfig]) -> list[str]:
    """Keys a transformers config class declares: its dataclass fields and its __init__ parameters."""
    names = [f.name for f in dataclasses.fields(config_class)] if dataclasses.is_dataclass(config_class) else []
    names += [p.name for p in keyword_parameters(config_class.__init__) if p.name not in names]
    return names


def build_base_config(fields: dict[str, Any]) -> PretrainedConfig:
    """A transformers config from user-written fields (`model_type` plus the class's keys), strictly.

    transformers keeps an unknown key as a plain attribute, so `hidden_sizee: 64` would build a model
    with the default width. Here such a key is an error naming the nearest valid key. Keys that the
    class consumes and converts (e.g. `rope_theta` into `rope_parameters`) are accepted.
    """
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError("a base config needs a 'model_type' key (e.g. llama) and the fields of that config class")
    given = dict(fields)
    model_type = given.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **given)
    except KeyError as err:
        raise ValueError(f"unknown base model_type {model_type!r}") from err
    known = known_config_keys(type(config))
    stored = vars(config)
    for key in given:
        if key not in known and key in stored:
            raise ValueError(unknown_name_message(f"{type(config).__name__} key", key, known))
    return config


def resolve_base_config(base_config: PretrainedConfig | dict[str, Any] | str) -> PretrainedConfig:
    """A base config given as an object, a dict of user-written fields with `model_type` (checked key by
    key, `build_base_config`) or a hub id / local path."""
    if isinstance(base_config, str):
        return AutoConfig.from_pretrained(base_config)
    if isinstance(base_config, dict):
        return build_base_config(base_config)
    return base_config


def _as_base_config(base_config: PretrainedConfig | dict[str, Any] | None) -> PretrainedConfig | None:
    """A serialised base config (a saved config.json's dict with `model_type`) back as its class.

    Lenient on purpose: saved files carry keys of other transformers versions; user-written fields go
    through `build_base_config` instead.
    """
    if base_config is None or isinstance(base_config, PretrainedConfig):
        return base_config
    if not isinstance(base_config, dict) or "model_type" not in base_config:
        raise ValueError("base_config must be a transformers PretrainedConfig or a dict with a 'model_type' key")
    fields = dict(base_config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


INHERITED_BASE_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")


def inherit_base_fields(base_config: PretrainedConfig | None, kwargs: dict[str, Any]) -> None:
    """A wrapper config's special token ids and embedding tying default to its base config's, so
    `generate()` and weight tying read the same values through either config. So does its attention
    implementation: transformers sets a composite config's on its sub-configs, so a wrapper built
    without one would reset the base's (the attention a retrofitted model was loaded with)."""
    if base_config is None:
        return
    for name in INHERITED_BASE_FIELDS:
        kwargs.setdefault(name, getattr(base_config, name, None))
    kwargs.setdefault("attn_implementation", base_config._attn_implementation)


# ---------------------------------------------------------------------------------------------- forward path


@dataclass(frozen=True)
class ForwardPath:
    """What one forward call runs: the path and, for Jacobi, its depths and early-stop tolerance."""

    recurrence: RecurrencePath
    d_forward: int
    d_backward: int
    jacobi_tol: float | None = None
    bptt_window: int | None = None  # exact path with gradients: how many tokens back R carries them
    exact_solver: ExactSolver = "sequential"  # how the exact path solves R over a multi-token chunk
    fixed_point_tol: float = 1e-4
    fixed_point_chunk: int = 64
    fixed_point_cap: int = 16

    def describe(self) -> str:
        if self.recurrence == "exact" and self.exact_solver != "sequential":
            return (f"exact ({self.exact_solver}: fixed_point_tol={self.fixed_point_tol}, "
                    f"fixed_point_chunk={self.fixed_point_chunk}, fixed_point_cap={self.fixed_point_cap})")
        if self.recurrence == "exact" and self.bptt_window is not None:
            return f"exact (bptt_window={self.bptt_window})"
        if self.recurrence != "jacobi":
            return self.recurrence
        return f"jacobi (d_forward={self.d_forward}, d_backward={self.d_backward}, jacobi_tol={self.jacobi_tol})"


# ---------------------------------------------------------------------------------------------- the config


class BaseConfigAttribute:
    """A standard attribute of the wrapped decoder's config, read and written through the wrapper's config.

    Tools read `config.hidden_size`, `config.num_hidden_layers`, ... of any causal LM, and some set
    `config.vocab_size` after resizing the embedding: the value lives once, in `base_config`. Without a
    base config the attribute is absent (AttributeError, so `hasattr` is False), as on any config that
    lacks it. `fixed`: why the attribute cannot be set through the wrapper (None: it can)."""

    def __init__(self, fixed: str | None = None) -> None:
        self.fixed = fixed

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, config: Any, owner: type | None = None) -> Any:
        if config is None:
            return self
        return getattr(self.base_of(config), self.name)

    def __set__(self, config: Any, value: Any) -> None:
        if self.fixed is not None:
            raise ValueError(f"{self.name} cannot be set on a {type(config).__name__}: {self.fixed}")
        setattr(self.base_of(config), self.name, value)

    def base_of(self, config: Any) -> PretrainedConfig:
        base = vars(config).get("base_config")
        if base is None:
            name = type(config).__name__
            raise AttributeError(f"this {name} has no base_config, so no {self.name}; build it with {name}.from_base")
        return base


class WrapsBaseConfig:
    """Mixin of a config that holds a wrapped decoder's config as `base_config` (list it before
    PretrainedConfig): a composite config in transformers' sense (`sub_configs`), so the attention
    implementation and dtype set on it reach the base config. Depth, width and vocabulary are the
    base's (`BaseConfigAttribute`), and caches and generation read the base's layer layout,
    vocabulary and special tokens (`get_text_config`)."""

    sub_configs: ClassVar[dict[str, type]] = {"base_config": AutoConfig}
    base_config: PretrainedConfig | None

    vocab_size = BaseConfigAttribute()
    hidden_size = BaseConfigAttribute()
    intermediate_size = BaseConfigAttribute()
    num_hidden_layers = BaseConfigAttribute(
        fixed="it is the depth of the base model, in which l_start..l_end place the recurrence; changing the block "
        "list (PEFT's layer_replication) is not supported"
    )
    num_attention_heads = BaseConfigAttribute()
    num_key_value_heads = BaseConfigAttribute()
    head_dim = BaseConfigAttribute()
    max_position_embeddings = BaseConfigAttribute()
    use_cache = BaseConfigAttribute()

    @property
    def num_layers(self) -> int:
        return int(self.require_base_config().num_hidden_layers)

    def require_base_config(self) -> PretrainedConfig:
        if self.base_config is None:
            name = type(self).__name__
            raise ValueError(f"this {name} has no base_config; build it with {name}.from_base(base_config, ...)")
        return self.base_config

    def get_text_config(self, *args: Any, **kwargs: Any) -> PretrainedConfig:
        """Caches and generation read layer layout and vocabulary from the wrapped decoder's config
        (this config itself while it has none, as transformers answers for a config without a text part)."""
        base = vars(self).get("base_config")
        return self if base is None else base.get_text_config(*args, **kwargs)

    def to_diff_dict(self) -> dict[str, Any]:
        """transformers' diff, without the base config's `_name_or_path`: the path on the machine that loaded
        the base model (transformers drops the top config's own the same way)."""
        serialised = super().to_diff_dict()
        if isinstance(serialised.get("base_config"), dict):
            serialised["base_config"].pop("_name_or_path", None)
        return serialised


class T2MLRConfig(WrapsBaseConfig, PretrainedConfig):
    """Configuration of a T²MLR causal LM wrapping a Hugging Face decoder.

    Args:
        base_config: config of the wrapped decoder (Llama, Mistral, Qwen2 or Qwen3 family).
        **kwargs: the recurrence settings, each a field of `t2mlr.settings.T2MLRSettings` (where they are
            explained, with their defaults), then transformers' own config keys.
    """

    model_type = "t2mlr"

    def __init__(self, base_config: PretrainedConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.base_config = _as_base_config(base_config)
        for name, value in take_settings(T2MLRSettings, kwargs).items():
            setattr(self, name, value)
        inherit_base_fields(self.base_config, kwargs)
        if self.base_config is not None:
            kwargs.setdefault("auto_map", dict(AUTO_MAP))  # loads without `import t2mlr` (remote_code.py)
        super().__init__(**kwargs)
        if self.base_config is not None:
            self.validate_recurrence()

    @classmethod
    def register_for_auto_class(cls, auto_class: str | type = "AutoConfig") -> None:
        """Nothing to record. transformers calls this when it loads the class through `auto_map`, and would
        then copy this module into every later save and point `auto_map` at that copy; every save writes
        the `auto_map` modules itself instead (`remote_code.write_remote_code_modules`)."""

    @classmethod
    def recurrence_fields(cls) -> dict[str, Field]:
        """The recurrence settings (`t2mlr.settings.T2MLRSettings`), typed, with defaults."""
        return settings_fields(T2MLRSettings)

    @classmethod
    def from_base(
        cls, base_config: PretrainedConfig | dict[str, Any] | str, l_start: int, l_end: int, **kwargs: Any
    ) -> "T2MLRConfig":
        """Build a T²MLR config around a base config: an object, a dict of its fields with `model_type`
        (checked key by key) or a hub id / local path. `kwargs` are recurrence fields only."""
        check_known_names(kwargs, cls.recurrence_fields(), "T2MLRConfig field")
        return cls(base_config=resolve_base_config(base_config), l_start=l_start, l_end=l_end, **kwargs)

    def validate_recurrence(self) -> None:
        """Check every recurrence field; the message says what is wrong and what is allowed."""
        base = self.require_base_config()
        model_type = getattr(base, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"T²MLR cannot wrap base model type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        check_block_range(self.l_start, self.l_end, self.num_layers, ("l_start", "l_end"))
        check_depths(self.d_forward, self.d_backward)
        check_jacobi_tol(self.jacobi_tol)
        check_bptt_window(self.bptt_window)
        check_exact_solver(self.exact_solver, self.fixed_point_tol, self.fixed_point_chunk, self.fixed_point_cap)
        for name in ("train_recurrence", "eval_recurrence"):
            check_recurrence_path(getattr(self, name), name)
        if self.recurrence_mask_policy not in RECURRENCE_MASK_POLICIES:
            raise ValueError(
                f"recurrence_mask_policy must be one of {RECURRENCE_MASK_POLICIES}, got {self.recurrence_mask_policy!r}"
            )
        if not isinstance(self.cache_residual, bool):
            raise ValueError(f"cache_residual must be a bool, got {self.cache_residual!r}")
        check_cache_update(self.cache_residual, self.cache_residual_weight, self.cache_residual_detach,
                           self.cache_post_norm, self.state_detach)
        if isinstance(self.gate_init_scale, bool) or not isinstance(self.gate_init_scale, (int, float)) \
                or not self.gate_init_scale >= 0:
            raise ValueError(f"gate_init_scale must be a number >= 0, got {self.gate_init_scale!r}")
        check_fusion(self.fusion, self.fusion_gate, self.fusion_r_norm, self.fusion_weight, self.fusion_bottleneck)

    def forward_path(
        self,
        training: bool,
        recurrence: str | None = None,
        d_forward: int | None = None,
        d_backward: int | None = None,
        jacobi_tol: float | None = None,
        bptt_window: int | None = None,
        exact_solver: str | None = None,
        fixed_point_tol: float | None = None,
        fixed_point_chunk: int | None = None,
    ) -> ForwardPath:
        """The path of one forward call: each argument given explicitly wins, else the config's field
        (`train_recurrence` in training mode, `eval_recurrence` in evaluation mode)."""
        if recurrence is None:
            recurrence = self.train_recurrence if training else self.eval_recurrence
        check_recurrence_path(recurrence)
        path = ForwardPath(
            recurrence=recurrence,
            d_forward=self.d_forward if d_forward is None else d_forward,
            d_backward=self.d_backward if d_backward is None else d_backward,
            jacobi_tol=self.jacobi_tol if jacobi_tol is None else jacobi_tol,
            bptt_window=self.bptt_window if bptt_window is None else bptt_window,
            exact_solver=self.exact_solver if exact_solver is None else exact_solver,
            fixed_point_tol=self.fixed_point_tol if fixed_point_tol is None else fixed_point_tol,
            fixed_point_chunk=self.fixed_point_chunk if fixed_point_chunk is None else fixed_point_chunk,
            fixed_point_cap=self.fixed_point_cap,
        )
        if recurrence == "exact":
            check_bptt_window(path.bptt_window)
            check_exact_solver(path.exact_solver, path.fixed_point_tol, path.fixed_point_chunk, path.fixed_point_cap)
        if recurrence == "jacobi":
            check_depths(path.d_forward, path.d_backward)
            check_jacobi_tol(path.jacobi_tol)
        return path


AutoConfig.register(T2MLRConfig.model_type, T2MLRConfig, exist_ok=True)
