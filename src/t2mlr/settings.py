"""Every architecture's settings as pure data, with their checks: the schema a `model:` section, a config class
and `from_base` are all read against. Torch-free and transformers-free, so the CLI answers a misspelt key or a bad
value before the heavy libraries load; the config classes (`t2mlr.model.configuration.T2MLRConfig`, the looped and
pause-token baselines' configs) take their fields from here, so a setting is declared once.

`ARCHITECTURE_SETTINGS` names each `model.arch`'s settings class (`transformer`, the base model itself, has none).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args

from t2mlr.utils import Field, unknown_name_message

RecurrencePath = Literal["exact", "jacobi", "off"]
RecurrenceMaskPolicy = Literal["all", "mask"]
ExactSolver = Literal["sequential", "fixed_point", "auto"]
RECURRENCE_PATHS: tuple[str, ...] = get_args(RecurrencePath)
EXACT_SOLVERS: tuple[str, ...] = get_args(ExactSolver)
RECURRENCE_MASK_POLICIES: tuple[str, ...] = get_args(RecurrenceMaskPolicy)
FusionKind = Literal[
    "gated", "none", "constant", "concat", "variance_normalized", "alpha_coupled", "recurrent_only", "bottleneck"
]
FusionGate = Literal["linear", "mlp"]
FUSION_KINDS: tuple[str, ...] = get_args(FusionKind)
FUSION_GATES: tuple[str, ...] = get_args(FusionGate)
GATE_PROJECTED_FUSIONS = ("gated", "variance_normalized", "alpha_coupled")  # the variants `fusion_gate` shapes
DEFAULT_FUSION_WEIGHT = 0.1
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


# ---------------------------------------------------------------------------------------------- checks


def check_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")


def check_depths(d_forward: int, d_backward: int) -> None:
    """Jacobi depths: at least one cache iterate, and no more gradient iterates than iterates."""
    check_int(d_forward, "d_forward")
    check_int(d_backward, "d_backward")
    if d_forward < 1:
        raise ValueError(f"d_forward must be >= 1 (number of Jacobi cache iterations), got {d_forward}")
    if not 1 <= d_backward <= d_forward:
        raise ValueError(f"d_backward must satisfy 1 <= d_backward <= d_forward={d_forward}, got {d_backward}")


def check_block_range(start: Any, end: Any, num_layers: int, names: tuple[str, str]) -> None:
    """A 1-based, inclusive block range inside a `num_layers`-block model; `names` are the fields' names."""
    check_int(start, names[0])
    check_int(end, names[1])
    if not 1 <= start <= end <= num_layers:
        first, last = names
        raise ValueError(
            f"need 1 <= {first} <= {last} <= {num_layers} (1-based, inclusive block indices of a {num_layers}-block "
            f"model); got {first}={start}, {last}={end}"
        )


def check_fusion(kind: Any, gate: Any, r_norm: Any, weight: Any, bottleneck: Any) -> None:
    """The fusion Φ's fields (`t2mlr.model.fusion`): a known variant, and each variant's own setting only
    with the variant it shapes, so a setting that would change nothing is an error instead."""
    if kind not in FUSION_KINDS:
        raise ValueError(unknown_name_message("fusion", str(kind), FUSION_KINDS))
    if gate not in FUSION_GATES:
        raise ValueError(f"fusion_gate must be one of {FUSION_GATES}, got {gate!r}")
    if gate != "linear" and kind not in GATE_PROJECTED_FUSIONS:
        raise ValueError(f"fusion_gate={gate!r} shapes the gate projection of fusion in {GATE_PROJECTED_FUSIONS}; "
                         f"fusion={kind!r} has none: leave fusion_gate='linear'")
    if not isinstance(r_norm, bool):
        raise ValueError(f"fusion_r_norm must be a bool, got {r_norm!r}")
    if r_norm and kind == "none":
        raise ValueError("fusion_r_norm normalises R before Φ reads it; fusion='none' does not read R: leave it False")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"fusion_weight must be a finite number, got {weight!r}")
    if weight != DEFAULT_FUSION_WEIGHT and kind != "constant":
        raise ValueError(f"fusion_weight is the fixed c of fusion='constant'; fusion={kind!r} has no c: leave it at "
                         f"{DEFAULT_FUSION_WEIGHT} or set fusion='constant'")
    if bottleneck is not None:
        check_int(bottleneck, "fusion_bottleneck")
        if bottleneck < 1:
            raise ValueError(f"fusion_bottleneck must be >= 1 (the bottleneck MLP's width) or None, got {bottleneck}")
        if kind != "bottleneck":
            raise ValueError(f"fusion_bottleneck is the width of fusion='bottleneck'; fusion={kind!r} has none: "
                             "leave it None or set fusion='bottleneck'")


def check_cache_update(residual: bool, weight: Any, detach_residual: Any, post_norm: Any, state_detach: Any) -> None:
    """The cache update's fields (`t2mlr.model.fusion.StateUpdate`): the residual's settings only with the
    residual, so a setting that would change nothing is an error."""
    for name, value in (("cache_residual_detach", detach_residual), ("cache_post_norm", post_norm),
                        ("state_detach", state_detach)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"cache_residual_weight must be a finite number, got {weight!r}")
    if not residual:
        changed = [f"{name}={value!r}" for name, value, default in (
            ("cache_residual_weight", weight, 1.0), ("cache_residual_detach", detach_residual, False),
            ("cache_post_norm", post_norm, True)) if value != default]
        if changed:
            raise ValueError(f"{', '.join(changed)} shape(s) the temporal residual R_t = norm(h_t + w·R_(t-1)); "
                             "cache_residual=False writes R_t = h_t: set cache_residual=True or leave them at "
                             "their defaults")


def check_recurrence_path(path: Any, name: str = "recurrence") -> None:
    if path not in RECURRENCE_PATHS:
        raise ValueError(f"{name} must be one of {RECURRENCE_PATHS}, got {path!r}")


def check_jacobi_tol(tol: Any, name: str = "jacobi_tol") -> None:
    if tol is None:
        return
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
        raise ValueError(f"{name} must be >= 0 or None, got {tol!r}")


def check_exact_solver(solver: Any, tol: Any, chunk: Any, cap: Any) -> None:
    """The exact path's solver and the fixed-point solver's settings (docs/model.md, "Solving the exact path")."""
    if solver not in EXACT_SOLVERS:
        raise ValueError(f"exact_solver must be one of {EXACT_SOLVERS}, got {solver!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < float("inf"):
        raise ValueError(f"fixed_point_tol must be a finite number > 0 (max |change of R| between passes), got {tol!r}")
    check_int(chunk, "fixed_point_chunk")
    if chunk < 2:
        raise ValueError(f"fixed_point_chunk must be >= 2 tokens (a 1-token chunk is the sequential step), got {chunk}")
    check_int(cap, "fixed_point_cap")
    if cap < 1:
        raise ValueError(f"fixed_point_cap must be >= 1 (fused passes per chunk before the sequential fallback), got {cap}")


def check_bptt_window(window: Any) -> None:
    if window is None:
        return
    check_int(window, "bptt_window")
    if window < 1:
        raise ValueError(f"bptt_window must be >= 1 (tokens the gradient reaches back through R) or None, got {window}")


# ---------------------------------------------------------------------------------------------- the schemas


@dataclass(frozen=True)
class T2MLRSettings:
    """The recurrence settings of a T²MLR model (`T2MLRConfig`'s fields beside `base_config`).

    l_start, l_end: first and last block of the recurrent middle block, 1-based, inclusive.
    cache_residual: R_t = RMSNorm(h_t + R_{t-1}) when True (default), else R_t = h_t.
    gate_init_scale: multiplies the base model's `initializer_range` for the fusion linears f_cur, f_rec and W_rec.
        The scalar gates γ always start at 0, so Φ(h, r) = h at init.
    d_forward: Jacobi cache iterations (the middle block runs d_forward + 1 times).
    d_backward: how many of the most recent cache iterates carry gradients (truncated BPTT).
    jacobi_tol: stop the detached Jacobi iterations early once max |ΔR| <= jacobi_tol (None: never).
    bptt_window: exact-path training with truncated backpropagation through time: the loss at a token reaches back
        through R this many tokens (None: through the whole sequence).
    exact_solver: how the exact path computes R over a multi-token chunk: "sequential" (token by token, the
        definition), "fixed_point" (Jacobi passes over chunks of `fixed_point_chunk` tokens until R moves by at most
        `fixed_point_tol`, the sequential step for what `fixed_point_cap` passes leave unsettled) or "auto"
        (fixed_point where it applies, sequential for the rest of a forward once a chunk has fallen back).
        docs/model.md, "Solving the exact path".
    fixed_point_tol, fixed_point_chunk, fixed_point_cap: the fixed-point solver's settings.
    train_recurrence / eval_recurrence: forward path used when `recurrence=None` in training and evaluation mode:
        "exact", "jacobi" or "off" (plain base model). Never switched silently.
    recurrence_mask_policy: "all" (every real token fuses R) or "mask" (the caller passes a per-token
        `recurrence_mask`; masked tokens skip Φ but still update the cache).
    fusion: the fusion Φ: "gated" (the paper's, default), "none", "constant", "concat", "variance_normalized",
        "alpha_coupled", "recurrent_only" or "bottleneck"; each one's formula is in `t2mlr.model.fusion` and
        docs/model.md.
    fusion_gate: the gate projection of "gated", "variance_normalized" and "alpha_coupled": "linear" (default) or
        "mlp" (Linear·SiLU·Linear).
    fusion_r_norm: RMSNorm (learnable gain) on R before Φ reads it.
    fusion_weight: the fixed c of "constant" (h + c·W_rec r).
    fusion_bottleneck: the width of "bottleneck"'s MLP (None: hidden_size // 4).
    cache_residual_weight: w in R_t = RMSNorm(h_t + w·R_{t-1}) (default 1, the paper's).
    cache_residual_detach: no gradient through the residual's R_{t-1}.
    cache_post_norm: the RMSNorm after the residual (default True; False: R_t = h_t + w·R_{t-1}).
    state_detach: R is written without gradient: none crosses from one token to the next through R.
    """

    l_start: int = 1
    l_end: int = 1
    cache_residual: bool = True
    gate_init_scale: float = 1.0
    d_forward: int = 16
    d_backward: int = 4
    jacobi_tol: float | None = None
    bptt_window: int | None = None
    exact_solver: ExactSolver = "sequential"
    fixed_point_tol: float = 1e-4
    fixed_point_chunk: int = 64
    fixed_point_cap: int = 16
    train_recurrence: RecurrencePath = "jacobi"
    eval_recurrence: RecurrencePath = "exact"
    recurrence_mask_policy: RecurrenceMaskPolicy = "all"
    fusion: FusionKind = "gated"
    fusion_gate: FusionGate = "linear"
    fusion_r_norm: bool = False
    fusion_weight: float = DEFAULT_FUSION_WEIGHT
    fusion_bottleneck: int | None = None
    cache_residual_weight: float = 1.0
    cache_residual_detach: bool = False
    cache_post_norm: bool = True
    state_detach: bool = False


@dataclass(frozen=True)
class LoopedSettings:
    """The looped Transformer baseline's settings (`LoopedConfig`).

    loop_blocks: the looped range as text: "full" (every block) or "S-E", 1-based and inclusive (e.g. "9-22"); sets
        loop_start and loop_end, and may not contradict them where they are given.
    loop_start, loop_end: first and last looped block, 1-based and inclusive (1..L loops every block).
    loops: how many times the range runs per token (K >= 1; 1 is the base model).
    """

    loop_blocks: str | None = None
    loop_start: int | None = None
    loop_end: int | None = None
    loops: int = 1


@dataclass(frozen=True)
class PauseSettings:
    """The pause-token baseline's settings (`PauseConfig`).

    pauses: pause tokens after every real token: P − 1 for a ×P model (1 for the paper's ×2).
    pause_token_id: id of the first pause token (default: the base vocabulary size); pause j has id
        pause_token_id + j. Must not collide with the vocabulary [0, vocab_size).
    """

    pauses: int = 1
    pause_token_id: int | None = None


ARCHITECTURE_SETTINGS: dict[str, type | None] = {
    "t2mlr": T2MLRSettings,
    "looped": LoopedSettings,
    "pause": PauseSettings,
    "transformer": None,  # the base model itself: no settings
}


def settings_fields(settings: type | None) -> dict[str, Field]:
    """The fields of a settings class, typed, with defaults (none for `None`, the plain base model)."""
    if settings is None:
        return {}
    hints = typing.get_type_hints(settings)
    return {f.name: Field(f.name, hints[f.name], f.default) for f in dataclasses.fields(settings)}


def take_settings(settings: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A config class's settings out of its `__init__` keywords (each one's default where not given); what is
    left in `kwargs` goes on to transformers' `PretrainedConfig`."""
    return {f.name: kwargs.pop(f.name, f.default) for f in dataclasses.fields(settings)}
