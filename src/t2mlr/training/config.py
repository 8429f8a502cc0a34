"""Typed training configuration, loaded from YAML with dotted `key=value` overrides.

Every section is a dataclass so a typo (`optim.lrr=1e-3`) fails before any compute is spent, with
the valid keys in the message. Values are coerced to the declared field types, which also fixes
YAML's habit of reading `5e-4` (no dot) as a string.

A YAML file may start with `extends: other.yaml` (a path relative to the file): the other file is
loaded first and this file's keys are merged into it, so the four paper placements share one preset.
A mapping tagged `!replace` replaces the inherited mapping instead of merging into it: a baseline preset
extends the T²MLR preset of its setting and writes its own `model: !replace` section, without the
T²MLR settings it would otherwise inherit.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import math
import random
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from t2mlr.settings import ARCHITECTURE_SETTINGS, DEFAULT_FUSION_WEIGHT, settings_fields
from t2mlr.utils import check_known_names, nearest_name, signature_fields

PRESET_DIRS = (
    Path(__file__).resolve().parents[1] / "configs",  # shipped in the package; <repo>/configs links here
)


class ConfigError(ValueError):
    """A configuration file or override names an unknown key or holds a value of the wrong type."""


class UnsupportedType(ConfigError):
    """A declared type the coercion does not know."""


class ReplacingMapping(dict):
    """A YAML mapping tagged `!replace`: it replaces the mapping it would otherwise be merged into."""


class _ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader plus the `!replace` tag."""


_ConfigLoader.add_constructor(
    "!replace", lambda loader, node: ReplacingMapping(loader.construct_mapping(node, deep=True))
)


@functools.cache
def declared_settings(arch: str) -> list[str]:
    """The setting names of `model.arch` ARCH (its settings class in `t2mlr.settings`)."""
    return list(settings_fields(ARCHITECTURE_SETTINGS[arch]))


@dataclass
class DepthSamplingConfig:
    """`model.d_forward_sampling`: the Jacobi depth of each training step drawn at random (the authors' release's
    default curriculum; PonderLM-2 trains with a sampled iteration count the same way), each allowed depth equally
    likely. `kind: uniform` draws from `min`..model.d_forward (`min` default 1), `kind: choice` from `values`. The
    draw is a function of train.seed and the step number alone, so a resumed run draws what an uninterrupted one
    would, and every rank and micro-batch of a step runs the same depth; d_backward is min(model.d_backward, depth).
    Evaluation keeps the model's own path."""

    kind: Literal["uniform", "choice"] = "uniform"
    min: int | None = None
    values: list[int] | None = None

    def depths(self, d_forward: int) -> list[int]:
        """The depths a step may draw, ascending; ValueError for a depth outside 1..d_forward or a setting of the
        other kind."""
        if self.kind == "uniform":
            if self.values is not None:
                raise ValueError("values belongs to kind choice; kind uniform draws from min..model.d_forward")
            low = 1 if self.min is None else self.min
            if not 1 <= low <= d_forward:
                raise ValueError(f"min {low} is outside 1..{d_forward} (model.d_forward): the depth is drawn from "
                                 "min..d_forward")
            return list(range(low, d_forward + 1))
        if self.min is not None:
            raise ValueError("min belongs to kind uniform; kind choice draws from values")
        if not self.values:
            raise ValueError("kind choice needs values, the depths to draw from (e.g. [4, 8, 16])")
        outside = [value for value in self.values if not 1 <= value <= d_forward]
        if outside:
            raise ValueError(f"values {outside} are outside 1..{d_forward} (model.d_forward)")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"values {self.values} name a depth twice")
        return sorted(self.values)

    def draw(self, d_forward: int, seed: int, step: int) -> int:
        """The depth of training step `step` (1-based) of a run seeded `seed`."""
        depths = self.depths(d_forward)
        return depths[random.Random(f"t2mlr d_forward_sampling {seed} {step}").randrange(len(depths))]


@dataclass
class ModelConfig:
    """What to train: `arch` (see `t2mlr.training.architectures`) around a Hugging Face decoder.

    Exactly one of `base` (a transformers config dict with `model_type`, trained from scratch; its keys
    are checked by that config class) or `pretrained` (hub id, local directory, .gguf file or the
    shortcut `smollm2-135m-instruct`, retrofitted: its weights are loaded into the wrapped model and its
    tokenizer is saved with the run's checkpoints); `gguf_file` names the GGUF file inside a `pretrained`
    directory or hub repo; `d_forward_sampling` (`DepthSamplingConfig`) draws a T²MLR's Jacobi depth per
    training step. Every other key of the YAML `model:` section is a setting of the architecture, declared
    by its config class (for `t2mlr`: the `T2MLRConfig` fields l_start, l_end, d_forward, d_backward,
    jacobi_tol, train_recurrence, eval_recurrence, cache_residual, gate_init_scale,
    recurrence_mask_policy, the fusion variant's fusion, fusion_gate, fusion_r_norm, fusion_weight,
    fusion_bottleneck, ...); `settings` holds all of them, defaults filled in.
    """

    arch: str = "t2mlr"
    base: dict[str, Any] | None = None
    pretrained: str | None = None
    gguf_file: str | None = None
    init_from: str | None = None
    activation_checkpointing: bool = False
    d_forward_sampling: DepthSamplingConfig | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_tree(cls, data: dict[str, Any], where: str) -> ModelConfig:
        """Split a flat `model:` mapping into the trainer's keys and the architecture's settings, each
        checked and coerced by its declaring class."""
        from t2mlr.training.architectures import ARCHITECTURES

        check_model_keys(data, where)
        fields = ARCHITECTURES[data.get("arch", cls.arch)].settings()
        own = [f.name for f in dataclasses.fields(cls) if f.name != "settings"]
        hints = typing.get_type_hints(cls)
        kwargs = {key: _coerce(value, hints[key], f"{where}{key}") for key, value in data.items() if key in own}
        settings = {
            name: _coerce(data[name], spec.type, f"{where}{name}") if name in data else spec.default
            for name, spec in fields.items()
        }
        return cls(**kwargs, settings=settings)

    def to_tree(self) -> dict[str, Any]:
        """The flat form written to YAML (the inverse of `from_tree`); `d_forward_sampling` only when set, so the
        recorded configs of runs without it read as before."""
        tree = {f.name: to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != "settings" and not (f.name == "d_forward_sampling" and self.d_forward_sampling is None)}
        tree.update(to_plain(self.settings))
        return tree

    def sized_settings(self) -> dict[str, Any]:
        """The settings of the heaviest training step: with `d_forward_sampling`, d_forward at the largest depth a
        step may draw (what `--dry-run` sizes)."""
        if self.d_forward_sampling is None:
            return self.settings
        largest = self.d_forward_sampling.depths(self.settings["d_forward"])[-1]
        return {**self.settings, "d_forward": largest, "d_backward": min(self.settings["d_backward"], largest)}

    def __getattr__(self, name: str) -> Any:
        """Settings read like fields (`cfg.model.l_start`); only called when no real attribute matches."""
        settings = self.__dict__.get("settings", {})
        if name in settings:
            return settings[name]
        raise AttributeError(f"{type(self).__name__} has no field or {self.arch!r} setting {name!r}")

    def setting(self, name: str) -> Any:
        """An architecture setting by name (its default when the architecture does not declare it)."""
        from t2mlr.training.architectures import get_architecture

        spec = get_architecture(self.arch).settings().get(name)
        return self.settings.get(name, None if spec is None else spec.default)


def check_model_keys(data: Mapping[str, Any], where: str = "model.") -> None:
    """Every key of a `model:` section is the trainer's or a setting of its `model.arch` (`t2mlr.settings`, pure
    data), so a misspelt key is answered before transformers loads."""
    own = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "settings"]
    arch_name = data.get("arch", ModelConfig.arch)
    if arch_name not in ARCHITECTURE_SETTINGS:
        raise ConfigError(f"{where}arch: must be one of {list(ARCHITECTURE_SETTINGS)}, got {arch_name!r}")
    valid = own + declared_settings(arch_name)
    for key in data:
        if key not in valid:
            owner = next((name for name in ARCHITECTURE_SETTINGS if key in declared_settings(name)), None)
            if owner is None:
                raise ConfigError(_unknown_key_message(f"{where}{key}", key, valid))
            raise ConfigError(
                f"{where}{key} is a setting of model.arch {owner!r}, not of {arch_name!r} (its keys: "
                f"{', '.join(valid)}); a config for another architecture that extends this one replaces the "
                "inherited model section with `model: !replace` (as smollm2_135m_baseline.yaml does)"
            )


@dataclass
class DataConfig:
    """Where training sequences come from.

    source: "jsonl" (a file of {"input_ids": [...]} or {"text": ...} lines, packed to seq_len),
    "shards" (a directory written by `t2mlr data tokenize`: memory-mapped shards with an index of
    document boundaries and a manifest; pretraining scale),
    "synthetic" (built-in learnable sequences, for smoke runs and tests), or "factory"
    (`factory: "package.module:function"` called with `kwargs`, returning a map-style Dataset).
    eos_token_id overrides the tokenizer's end-of-text id (needed for a bare tokenizer.json).
    """

    source: Literal["jsonl", "shards", "synthetic", "factory"] = "jsonl"
    path: str | None = None
    tokenizer: str | None = None
    seq_len: int = 2048
    text_field: str = "text"
    ids_field: str = "input_ids"
    append_eos: bool = True
    eos_token_id: int | None = None
    factory: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    labels_aligned_to_inputs: bool | None = None
    pad_token_id: int = 0
    seed: int = 0
    num_workers: int = 0

    def __post_init__(self) -> None:
        self.factory, self.kwargs = moved_factory(self.factory, self.kwargs)


# Data factories that moved, as run directories recorded them: old "module:function" -> (new one, keyword
# renames, keywords the new one needs to behave as the old did). A recorded config names the old one, and
# resuming it, or reading a checkpoint's training data (`t2mlr analyze ... --data train`), must still work.
MOVED_FACTORIES: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "t2mlr.experiments.s5_data:s5_stream_dataset": ("t2mlr.tasks.s5_data:s5_stream_dataset", {}, {}),
    "t2mlr.experiments.s5_data:s5_retrieval_dataset": ("t2mlr.tasks.s5_data:s5_retrieval_dataset", {}, {}),
    "t2mlr.experiments.finetune_data:sft_dataset": ("t2mlr.tasks.sft:sft_dataset", {}, {}),
    "t2mlr.experiments.retrofit_data:prompt_target_dataset": (
        "t2mlr.tasks.sft:sft_dataset", {"mask_prompt_recurrence": "prompt_recurrence_mask"}, {"bos": False}),
}


def moved_factory(factory: str | None, kwargs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """A data factory and its keywords under their current names (`MOVED_FACTORIES`)."""
    if factory not in MOVED_FACTORIES:
        return factory, kwargs
    new, renames, added = MOVED_FACTORIES[factory]
    return new, {**added, **{renames.get(key, key): value for key, value in kwargs.items()}}


def with_current_factories(tree: dict[str, Any]) -> dict[str, Any]:
    """A recorded config tree with moved data factories renamed (`moved_factory`), for comparing it with a
    config built today."""
    tree = deep_merge({}, tree)
    for section in (tree.get("data"), (tree.get("eval") or {}).get("data")):
        if isinstance(section, dict) and section.get("factory") in MOVED_FACTORIES:
            section["factory"], section["kwargs"] = moved_factory(section["factory"], section.get("kwargs") or {})
    return tree


@dataclass
class OptimConfig:
    """AdamW; γ's, norms and biases never decay; fusion parameters may use a multiplied lr."""

    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.01
    fusion_lr_mult: float = 1.0
    grad_clip: float | None = 1.0


@dataclass
class ScheduleConfig:
    """Linear warmup, then cosine (or linear, or constant) decay to `min_lr_ratio` × peak.

    total_steps sets the schedule's horizon; None means train.max_steps. Set it explicitly when
    you stop early with --max-steps and want the run's schedule unchanged.
    """

    kind: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.001
    total_steps: int | None = None


RAMPS: dict[str, Any] = {  # progress p in [0, 1] -> share of the way from start to end
    "linear": lambda p: p,
    "cosine": lambda p: (1 - math.cos(math.pi * p)) / 2,
    "exponential": lambda p: p * p,  # the release's name for a slow start and a fast finish
    "step": lambda p: 1.0 if p >= 0.5 else 0.0,
}


@dataclass
class RecurrentWeightCurriculum:
    """`train.recurrent_weight_curriculum` (T²MLR): the weight λ of the recurrent branch, Φ reading λ·R
    instead of R, ramped from `start` to `end` over the first `steps` optimizer steps and held at `end` after
    (the authors' release's curriculum). Before step s (1-based) λ = start + (end − start)·ramp((s − 1)/steps):
    linear p, cosine (1 − cos πp)/2, exponential p² (the release's name), step 0 then 1 from p = ½. A
    function of the step alone, so a resumed run uses what an uninterrupted one would; logged per step as
    `recurrent_weight`. Training steps only: evaluation, checkpoints and the saved model read R at weight 1."""

    schedule: Literal["linear", "cosine", "exponential", "step"] = "linear"
    steps: int = 0
    start: float = 0.0
    end: float = 1.0

    def value(self, step: int) -> float:
        """λ of optimizer step `step` (1-based)."""
        progress = min(max(step - 1, 0), self.steps) / self.steps
        return self.start + (self.end - self.start) * RAMPS[self.schedule](progress)


@dataclass
class TrainLoopConfig:
    """Loop settings. The global batch is fixed; accumulation = global / (micro × world size).

    warm_start_states (T²MLR on the Jacobi path, multi-epoch finetuning): keep each training row's
    recurrent states R from its last visit and start the next visit's Jacobi iteration from them instead
    of the seed pass. They are stale (computed with the weights of one epoch ago), so the iterates start
    near, not at, the fixed point; the iteration count stays d_forward. Costs one float per hidden unit
    per token of every row, kept on the CPU and saved with the checkpoints.

    max_seconds: a time budget. Training ends (as finished: final checkpoint and model) after the step whose
    optimizer-step time, summed over every attempt, reaches it, or at max_steps, whichever comes first. Evaluation
    and checkpointing do not count, so arms compared at equal budgets get equal training time. The LR schedule
    still spans max_steps (or schedule.total_steps): pair a budget with schedule.kind constant, or a horizon the
    budget reaches.
    """

    max_steps: int = 1000
    max_seconds: float | None = None
    global_batch_size: int = 8
    micro_batch_size: int = 8
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    parallel: Literal["none", "ddp", "fsdp"] = "none"
    warm_start_states: bool = False
    recurrent_weight_curriculum: RecurrentWeightCurriculum | None = None


@dataclass
class EvalConfig:
    """Periodic evaluation; `recurrence` None means model.eval_recurrence (logged explicitly).

    The eval set is the first `max_batches × batch_size` rows of eval.data whatever the number of
    ranks: `batch_size` is global and split evenly across ranks.
    """

    every: int = 0
    max_batches: int = 8
    batch_size: int = 8
    recurrence: Literal["exact", "jacobi", "off"] | None = None  # the model's RECURRENCE_PATHS (a test checks)
    data: DataConfig | None = None


@dataclass
class CheckpointConfig:
    """Atomic checkpoints every `every` steps (0: only at the end); keep the newest `keep_last`."""

    every: int = 0
    keep_last: int | None = 3
    save_final: bool = True


@dataclass
class LoggingConfig:
    every: int = 1
    progress_bar: bool = True
    progress_label: str = ""  # shown before the bar; names the run when several share a terminal
    progress_line: int | None = None  # tqdm position: the terminal line of this run's bar among concurrent runs
    tensorboard: bool = False


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def horizon(self) -> int:
        """Number of steps the LR schedule spans."""
        return self.schedule.total_steps if self.schedule.total_steps is not None else self.train.max_steps


# ---------------------------------------------------------------------------------------------
# Building dataclasses from plain data, with type coercion


def to_plain(obj: Any) -> Any:
    """Dataclasses → dicts, tuples → lists: the form written to YAML and compared on resume."""
    if hasattr(obj, "to_tree") and not isinstance(obj, type):
        return obj.to_tree()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from `data`, rejecting unknown keys and coercing values to field types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    if hasattr(cls, "from_tree"):
        return cls.from_tree(data, where)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(_unknown_key_message(f"{where}{key}", key, names))
    kwargs = {key: _coerce(value, hints[key], f"{where}{key}") for key, value in data.items()}
    return cls(**kwargs)


# What Hugging Face's TrainingArguments and similar configs call a key this schema names otherwise: a
# user who writes `optim.learning_rate` is pointed to `lr` although the spellings are far apart.
KEY_SYNONYMS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("learning_rate", "max_lr"), ("lr",)),
    **dict.fromkeys(("max_grad_norm", "clip_grad_norm"), ("grad_clip",)),
    **dict.fromkeys(("adam_beta1", "adam_beta2"), ("betas",)),
    "adam_epsilon": ("eps",),
    **dict.fromkeys(("lr_scheduler_type", "scheduler"), ("kind",)),
    "num_warmup_steps": ("warmup_steps",),
    "batch_size": ("global_batch_size", "micro_batch_size"),
    **dict.fromkeys(("train_batch_size", "gradient_accumulation_steps"), ("global_batch_size",)),
    "per_device_train_batch_size": ("micro_batch_size",),
    **dict.fromkeys(("num_train_steps", "steps"), ("max_steps",)),
    **dict.fromkeys(("save_steps", "logging_steps", "eval_steps"), ("every",)),
    "save_total_limit": ("keep_last",),
    **dict.fromkeys(("max_seq_length", "max_length", "block_size"), ("seq_len",)),
}


def suggested_key(key: str, names: list[str]) -> str | None:
    """The valid key a misspelt or foreign-named one most likely means: a synonym from other libraries'
    configs (`learning_rate` → `lr`), else the closest spelling."""
    synonym = next((name for name in KEY_SYNONYMS.get(key.lower(), ()) if name in names), None)
    return synonym or nearest_name(key, names)


def _unknown_key_message(dotted: str, key: str, names: list[str]) -> str:
    guess = suggested_key(key, names)
    hint = f" Did you mean {guess!r}?" if guess else ""
    return f"unknown config key {dotted!r}.{hint} Valid keys here: {', '.join(names)}"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce one value to type `tp` (the subset of typing this schema uses)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, args, where)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else from_dict(tp, value, where + ".")
    if origin in (list, tuple) and (origin is list or args[-1:] == (Ellipsis,)):  # list[X], tuple[X, ...]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return origin(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return _coerce_scalar(value, tp, where)


def coerce_declared(value: Any, tp: Any, where: str) -> Any:
    """Coerce a value to a declared type this schema knows (see `_coerce`); values of other declared
    types (paths, tuples of classes, ...) are passed on as YAML read them."""
    try:
        return _coerce(value, tp, where)
    except UnsupportedType:
        return value


def _coerce_union(value: Any, args: tuple[Any, ...], where: str) -> Any:
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: may not be null")
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except ConfigError as err:
            errors.append(str(err))
    raise ConfigError("; ".join(errors))


# The number types a field may declare: what YAML may give for them (never a bool) and how the error names them.
NUMBERS: dict[type, tuple[tuple[type, ...], str]] = {
    int: ((int, str), "an int"),
    float: ((int, float, str), "a number"),
}


def _coerce_scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where}: expected a bool, got {value!r}")
    if tp is int or tp is float:
        accepted, expected = NUMBERS[tp]
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ConfigError(f"{where}: expected {expected}, got {value!r}")
        try:
            return tp(value)
        except ValueError as err:
            raise ConfigError(f"{where}: expected {expected}, got {value!r}") from err
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if tp is Any:
        return value
    raise UnsupportedType(f"{where}: unsupported field type {tp!r}")


# ---------------------------------------------------------------------------------------------
# YAML files, presets and overrides


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path to a YAML file, or the name of a preset under configs/ (e.g. "debug")."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for folder in PRESET_DIRS:
        for candidate in (folder / f"{name_or_path}.yaml", folder / str(name_or_path)):
            if candidate.is_file():
                return candidate
    presets = sorted({p.stem for d in PRESET_DIRS if d.is_dir() for p in d.glob("*.yaml")})
    raise ConfigError(f"config {str(name_or_path)!r} is neither a file nor a preset; presets: {', '.join(presets)}")


def load_yaml_tree(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config, following `extends:` chains (relative to the file) and merging."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError(f"circular 'extends' chain: {' -> '.join(str(p) for p in (*_seen, path))}")
    with open(path, encoding="utf-8") as handle:
        tree = yaml.load(handle, Loader=_ConfigLoader) or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = tree.pop("extends", None)
    if parent is None:
        return tree
    base = load_yaml_tree(resolve_config_path(path.parent / parent), (*_seen, path))
    return deep_merge(base, tree)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge `update` into a deep copy of `base` (mappings merge, unless tagged `!replace`;
    everything else replaces); the result shares no mapping or list with either argument."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and not isinstance(value, ReplacingMapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """`optim.lr=1e-3` → (["optim", "lr"], 0.001). The value is parsed as YAML (lists, null, bools)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key component")
    return parts, yaml.safe_load(raw) if raw.strip() else ""


SOURCE_SETTINGS = ("kwargs", "factory")  # a data section's settings that belong to its source


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a plain config tree. Unknown keys are caught later by `from_dict`.

    Choosing another data source (`data.source=jsonl`, `eval.data.source=...`) drops the settings that
    belonged to the preset's source (its `kwargs` and `factory`) unless the overrides set them too, so any
    source can be chosen on the command line whatever the preset's was."""
    tree = deep_merge({}, tree)
    parsed = [(text, *parse_override(text)) for text in overrides]
    given = {tuple(parts) for _, parts, _ in parsed}
    for text, parts, value in parsed:
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        if parts[-1] == "source" and value != node.get("source"):
            for setting in SOURCE_SETTINGS:
                if not any(key[: len(parts)] == (*parts[:-1], setting) for key in given):
                    node.pop(setting, None)
        node[parts[-1]] = value
    return tree


def load_tree(name_or_path: str | Path, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """A YAML file or preset (`extends:` followed) with dotted overrides applied, as a plain tree: what every
    config loader starts from."""
    return apply_overrides(load_yaml_tree(resolve_config_path(name_or_path)), list(overrides or []))


def load_sections(name_or_path: str | Path, overrides: Sequence[str], sections: Mapping[str, type]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A YAML config holding sections beyond the trainer's (an experiment's `task:`), with dotted overrides:
    the trainer's part as a plain tree of every setting, coerced and checked as `t2mlr train` checks them (the rules
    across fields, such as a data source's path, once the experiment has filled in what it derives), and each
    further section built as its dataclass (unknown keys and wrong types refused the same way, e.g. `task.kk`
    → `k`)."""
    tree = load_tree(name_or_path, overrides)
    built = {name: from_dict(cls, tree.pop(name, None) or {}, f"{name}.") for name, cls in sections.items()}
    return to_plain(from_dict(TrainConfig, tree)), built


def changed_settings(saved: Any, current: Any, neutral: Sequence[str] = (), prefix: str = "") -> list[str]:
    """`key: saved → current` for every dotted key whose value differs between two config trees, except the
    keys under `neutral` (settings that do not change a run's result): what a resume would change."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [line for key in sorted(set(saved) | set(current))
                for line in changed_settings(saved.get(key), current.get(key), neutral, f"{prefix}{key}.")]
    name = prefix.rstrip(".")
    if saved == current or any(name == n or name.startswith(n + ".") for n in neutral):
        return []
    return [f"{name}: {saved!r} → {current!r}"]


def load_config(name_or_path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Load a YAML file or preset, apply overrides, type-check and validate it."""
    return config_from_tree(load_tree(name_or_path, overrides))


def config_from_tree(tree: dict[str, Any]) -> TrainConfig:
    cfg = from_dict(TrainConfig, tree)
    validate(cfg)
    return cfg


def save_config(cfg: TrainConfig, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(cfg.to_dict(), handle, sort_keys=False)


def dataset_callable(cfg: DataConfig) -> Callable[..., Any]:
    """What `data.kwargs` are passed to: `SyntheticChainDataset`, or the imported `data.factory`."""
    if cfg.source == "synthetic":
        from t2mlr.training.synthetic import SyntheticChainDataset

        return SyntheticChainDataset
    module_name, _, attr = (cfg.factory or "").partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"data.factory {cfg.factory!r} cannot be imported: {err}") from err


def dataset_kwargs(cfg: DataConfig) -> dict[str, Any]:
    """`data.kwargs` checked name by name against the callable's own parameters (the nearest valid name in
    the error) and coerced to their declared types, plus seq_len and seed from the data config."""
    target = dataset_callable(cfg)
    fields = signature_fields(target.__init__ if isinstance(target, type) else target)
    name = "SyntheticChainDataset" if cfg.source == "synthetic" else cfg.factory
    accepted = inspect.signature(target).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):  # a **kwargs takes any name
        check_known_names(cfg.kwargs, fields, f"keyword of {name} in data.kwargs")
    kwargs = {key: coerce_declared(value, fields[key].type, f"data.kwargs.{key}") if key in fields else value
              for key, value in cfg.kwargs.items()}
    if cfg.source == "synthetic":
        from t2mlr.training.synthetic import SYNTHETIC_DEFAULTS

        kwargs = {**SYNTHETIC_DEFAULTS, **kwargs}
    for key, value in (("seq_len", cfg.seq_len), ("seed", cfg.seed)):  # unless data.kwargs sets them
        if key in accepted and key not in kwargs:
            kwargs[key] = value
    return kwargs


def validate(cfg: TrainConfig) -> None:
    """Cross-field checks that types alone cannot express."""
    _validate_model(cfg.model)
    _validate_run(cfg)
    if cfg.eval.recurrence is not None and cfg.model.arch != "t2mlr":
        raise ConfigError(f"eval.recurrence applies to T²MLR models only; model.arch is {cfg.model.arch!r}")
    if cfg.train.warm_start_states and (cfg.model.arch != "t2mlr" or cfg.model.setting("train_recurrence") != "jacobi"):
        raise ConfigError(
            "train.warm_start_states starts the Jacobi iteration from stored states: it needs model.arch t2mlr with "
            f"model.train_recurrence jacobi (got arch {cfg.model.arch!r}, train_recurrence "
            f"{cfg.model.setting('train_recurrence')!r})"
        )


def check_before_loading(name_or_path: str | Path, overrides: Sequence[str], data_files: bool = True,
                         sections: Mapping[str, type] | None = None, rules: bool = True) -> None:
    """What can be checked before torch and transformers load (seconds instead of tens of them, so a typo or a bad
    data file is reported at once): the file, the overrides, every key and type of each section but `model` (of which
    only the key names: its types are the architecture's) and of the further `sections` (as in `load_sections`), with `rules` the rules among
    them (not for an experiment's config, whose data section the experiment fills in), and with `data_files` the
    data files (`t2mlr.training.data_files`). `load_config` then checks the rest."""
    from t2mlr.training.data_files import check_data_files

    tree = load_tree(name_or_path, overrides)
    for name, cls in (sections or {}).items():
        from_dict(cls, tree.pop(name, None) or {}, f"{name}.")
    check_model_keys(tree.get("model") or {})
    cfg = from_dict(TrainConfig, {key: value for key, value in tree.items() if key != "model"})
    if rules:
        _validate_run(cfg, factory_kwargs=False)
    if data_files:
        check_data_files(cfg)


def _validate_run(cfg: TrainConfig, factory_kwargs: bool = True) -> None:
    """The checks of every section but the model's; `factory_kwargs` also checks a synthetic or factory dataset's
    kwargs against its signature (which imports the factory's module)."""
    _validate_data(cfg.data, "data", factory_kwargs)
    if cfg.eval.data is not None:
        _validate_data(cfg.eval.data, "eval.data", factory_kwargs)
    if cfg.eval.every > 0 and cfg.eval.data is None:
        raise ConfigError("eval.every > 0 needs an eval.data section (evaluating on training data would mislead)")
    t = cfg.train
    for name in ("max_steps", "global_batch_size", "micro_batch_size"):
        if getattr(t, name) < 1:
            raise ConfigError(f"train.{name} must be >= 1, got {getattr(t, name)}")
    if t.max_seconds is not None and not t.max_seconds > 0:  # NaN fails too
        raise ConfigError(f"train.max_seconds must be > 0 (or null: no time budget), got {t.max_seconds}")
    if t.global_batch_size % t.micro_batch_size:
        raise ConfigError(
            f"train.global_batch_size ({t.global_batch_size}) must be a multiple of train.micro_batch_size "
            f"({t.micro_batch_size})"
        )
    curriculum = t.recurrent_weight_curriculum
    if curriculum is not None:
        if curriculum.steps < 1:
            raise ConfigError(f"train.recurrent_weight_curriculum.steps must be >= 1 (the optimizer steps λ ramps "
                              f"over), got {curriculum.steps}")
        if cfg.model.arch != "t2mlr":
            raise ConfigError(f"train.recurrent_weight_curriculum weighs T²MLR's recurrent branch: it needs model.arch "
                              f"t2mlr, not {cfg.model.arch!r}")
        for name in ("start", "end"):
            if not math.isfinite(getattr(curriculum, name)):
                raise ConfigError(f"train.recurrent_weight_curriculum.{name} must be a finite number")
    if t.warm_start_states and t.parallel != "none":
        raise ConfigError("train.warm_start_states keeps one process's store of states: use train.parallel none")
    if cfg.eval.batch_size < 1 or cfg.eval.max_batches < 1:
        raise ConfigError("eval: batch_size and max_batches must be >= 1")
    if cfg.schedule.warmup_steps < 0 or not 0 <= cfg.schedule.min_lr_ratio <= 1:
        raise ConfigError("schedule: need warmup_steps >= 0 and 0 <= min_lr_ratio <= 1")
    if cfg.optim.fusion_lr_mult <= 0 or cfg.optim.lr <= 0:
        raise ConfigError("optim: lr and fusion_lr_mult must be > 0")


def _validate_model(m: ModelConfig) -> None:
    """The base config by its own class, the architecture's settings against it (by the architecture's
    config class), and the trainer's own model keys."""
    from t2mlr.model.configuration import build_base_config
    from t2mlr.training.architectures import checkpointing_refusal, get_architecture

    if (m.base is None) == (m.pretrained is None):
        raise ConfigError("model: set exactly one of model.base (config dict, from scratch) or model.pretrained")
    if m.gguf_file is not None:
        if m.pretrained is None:
            raise ConfigError(f"model.gguf_file={m.gguf_file!r} needs model.pretrained (the directory or hub repo holding it)")
        if not m.gguf_file.lower().endswith(".gguf") or Path(m.gguf_file).name != m.gguf_file:
            raise ConfigError(f"model.gguf_file must be a bare file name ending in .gguf, got {m.gguf_file!r}")
    if m.base is not None:
        try:
            base_config = build_base_config(m.base)
        except ValueError as err:
            raise ConfigError(f"model.base: {err}") from err
        try:
            get_architecture(m.arch).check(base_config, m.settings)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
    if m.pretrained is not None and m.arch == "t2mlr":
        _check_retrofit_fusion(m.settings)
    if m.d_forward_sampling is not None:
        _validate_depth_sampling(m)
    refusal = checkpointing_refusal(m.arch, m.settings) if m.activation_checkpointing else None
    if refusal is not None:
        raise ConfigError(
            f"model.activation_checkpointing checkpoints the blocks a model runs several times per step (T²MLR's "
            f"middle block, a looped model's looped blocks); model.arch {m.arch!r} refuses it: {refusal}"
        )


def _check_retrofit_fusion(settings: dict[str, Any]) -> None:
    """model.pretrained retrofits T²MLR around a trained model, which must start as that model: a fusion
    variant that is not the identity when fresh is refused here, before anything is loaded."""
    from t2mlr.model.fusion import check_retrofit_fusion

    try:
        check_retrofit_fusion(settings.get("fusion", "gated"), settings.get("fusion_weight", DEFAULT_FUSION_WEIGHT))
    except ValueError as err:
        raise ConfigError(f"model.pretrained with model.fusion: {err}") from err


def _validate_depth_sampling(m: ModelConfig) -> None:
    recurrence = m.setting("train_recurrence")
    if m.arch != "t2mlr" or recurrence != "jacobi":
        raise ConfigError(f"model.d_forward_sampling draws the Jacobi depth of each training step: it needs model.arch "
                          f"t2mlr with model.train_recurrence jacobi (got arch {m.arch!r}, train_recurrence "
                          f"{recurrence!r})")
    try:
        m.d_forward_sampling.depths(m.settings["d_forward"])
    except ValueError as err:
        raise ConfigError(f"model.d_forward_sampling: {err}") from err


def _validate_data(d: DataConfig, where: str, factory_kwargs: bool = True) -> None:
    if d.seq_len < 2:
        raise ConfigError(f"{where}.seq_len must be >= 2, got {d.seq_len}")
    if d.source in ("jsonl", "shards") and not d.path:
        raise ConfigError(f"{where}.source={d.source} needs {where}.path")
    if d.source == "factory" and (not d.factory or ":" not in d.factory):
        raise ConfigError(f"{where}.source=factory needs {where}.factory = 'package.module:function'")
    if d.source in ("synthetic", "factory"):
        if not factory_kwargs:
            return
        try:
            dataset_kwargs(d)
        except ValueError as err:
            raise ConfigError(f"{where}.kwargs: {err}") from err
    elif d.kwargs:
        raise ConfigError(f"{where}.kwargs applies to source synthetic or factory only, not {d.source!r}")
