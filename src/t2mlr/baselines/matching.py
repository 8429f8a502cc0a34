"""Parameter matching: each baseline gets the smallest width whose parameter count is ≥ T²MLR's.

This module holds every parameter count and width search of the project. Counts come from building the
model on the meta device: every detail (tied embeddings, biases, q/k norms, the fusion module and the
cache norm, pause embeddings) is counted by the real module code, and no weights are allocated, so a
135M-parameter model costs milliseconds.

* Transformer: the T²MLR backbone with its hidden size raised, depth, head count, head dimension and
  MLP (intermediate) size kept, as in the paper (SmolLM2-135M, T²MLR(13,18): 576 → 584, still 9 heads
  of 64, so the attention projections map 584 → 576 and back). `matched_hidden_size` finds the width
  for any decoder family; `matched_transformer_config` gives a savable `MatchedLlamaConfig`.
* Looped and pause-token models: the same widened backbone inside the wrapper
  (`smallest_matching_width`). Looping shares weights, so a looped model lands where the Transformer
  does; the pause model also counts its `pauses × hidden` pause embeddings. At SmolLM2-135M with
  T²MLR(13,18) every one of them is at hidden 584, within 1% above T²MLR's count.
* LSTM, GRU, vanilla RNN: embedding → `num_layers`-layer cell → head, all of one width
  (`matched_recurrent_config`: the smallest such width whose count reaches T²MLR's).
* Comparisons: `ModelSpec` names one arm as the command line writes it (`t2mlr:13-18`,
  `looped:full:2`, `looped:9-22:3`, `pause:2`, `transformer`), and `matched_arms` builds every arm's
  config around one base shape, matched to T²MLR, for `t2mlr params` and the benchmarks. A T²MLR arm
  may name its own training path after the placement, so one comparison can hold T²MLR trained
  both ways: `t2mlr:1-2:exact`, `t2mlr:1-2:jacobi:16:4` (d_forward 16, d_backward 4). A Transformer arm
  may name its training budget: `transformer:compute-matched` is the same matched model trained for
  T²MLR's measured training compute (the experiment that runs it sets the step count). Fields are
  separated by ':' as in `looped:S-E:K`; the placement keeps its '-'.

Every search is `smallest_at_least`: doubling for an upper bound, then bisection, O(log w) model builds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from t2mlr.baselines.looped import LoopedConfig, parse_loop_blocks
from t2mlr.baselines.recurrent import (
    RECURRENT_CELLS,
    RecurrentLMConfig,
    RecurrentLMForCausalLM,
    recurrent_config_class,
)
from t2mlr.baselines.pause import PauseConfig
from t2mlr.baselines.transformer import (
    MatchedLlamaConfig,
    MatchedLlamaForCausalLM,
    matched_llama_config,
)
from t2mlr.model import T2MLRConfig, T2MLRForCausalLM

__all__ = [
    "COMPUTE_MATCHED",
    "MODEL_SPEC_FORMS",
    "Arm",
    "MatchedSet",
    "ModelSpec",
    "count_parameters",
    "head_dim_of",
    "lstm_parameter_count",
    "matched_arms",
    "matched_baseline_config",
    "matched_hidden_size",
    "matched_looped_config",
    "matched_models",
    "matched_pause_config",
    "matched_recurrent_baseline",
    "matched_recurrent_config",
    "matched_transformer_config",
    "parameter_count_of_config",
    "parse_looped_spec",
    "parse_model_spec",
    "parse_model_specs",
    "parse_pause_spec",
    "parse_placement",
    "parse_t2mlr_spec",
    "parse_transformer_spec",
    "recurrent_parameter_count",
    "smallest_at_least",
    "smallest_matching_width",
    "t2mlr_parameter_count",
    "transformer_parameter_count",
    "widened_config",
]

MAX_WIDTH = 1 << 20  # a search that passes this width is matching against a wrong count


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding/LM-head matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def _meta_count(build: Callable[[], nn.Module]) -> int:
    with torch.device("meta"):
        return count_parameters(build())


def parameter_count_of_config(config: PretrainedConfig) -> int:
    """Parameters of the causal LM that `config` describes, counted without allocating weights."""
    return _meta_count(lambda: AutoModelForCausalLM.from_config(config))


def head_dim_of(config: PretrainedConfig) -> int:
    """The config's explicit head dimension, else hidden_size / num_attention_heads."""
    explicit = getattr(config, "head_dim", None)
    if explicit is not None:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


def widened_config(base_config: PretrainedConfig, hidden_size: int) -> PretrainedConfig:
    """A copy of `base_config` (any decoder family) with `hidden_size` changed and the head count and
    head dimension kept; for timing and counting (a widened Llama saves as a `MatchedLlamaConfig`)."""
    config = copy.deepcopy(base_config)
    config.head_dim = head_dim_of(base_config)
    config.hidden_size = hidden_size
    return config


def smallest_at_least(count: Callable[[int], int], target: int, start: int = 1) -> int:
    """Smallest integer w ≥ start with count(w) ≥ target, for a count that grows with w.

    Doubling finds an upper bound, bisection the boundary: O(log w) model builds.
    """
    if start < 1:
        raise ValueError(f"start must be >= 1, got {start}")
    if count(start) >= target:
        return start
    low, high = start, 2 * start  # invariant: count(low) < target
    while count(high) < target:
        low, high = high, 2 * high
        if high > MAX_WIDTH:
            raise ValueError(f"no width up to {MAX_WIDTH} reaches {target} parameters")
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) >= target:
            high = middle
        else:
            low = middle
    return high


def matched_hidden_size(base_config: PretrainedConfig, target: int) -> int:
    """Smallest hidden size, from the base width up, whose widened base model has at least `target`
    parameters, with depth, head count, head dimension and MLP size unchanged. SmolLM2-135M with any
    T²MLR placement gives 584 (T²MLR adds 5d² + 3d + 2 parameters whatever the placement)."""
    return smallest_at_least(
        lambda hidden: parameter_count_of_config(widened_config(base_config, hidden)), target,
        start=int(base_config.hidden_size),
    )


def matched_baseline_config(base_config: PretrainedConfig, target: int) -> PretrainedConfig:
    """The base config widened to the matched hidden size (see `matched_hidden_size`)."""
    return widened_config(base_config, matched_hidden_size(base_config, target))


def t2mlr_parameter_count(config: T2MLRConfig) -> int:
    """Parameters of `T2MLRForCausalLM(config)`, counted as built: the base model plus Φ (5d² + 2d + 2 for the
    paper's; each `fusion` variant its own) and the cache norm (d)."""
    return _meta_count(lambda: T2MLRForCausalLM(config))


def transformer_parameter_count(config: MatchedLlamaConfig) -> int:
    return _meta_count(lambda: MatchedLlamaForCausalLM(config))


def recurrent_parameter_count(config: RecurrentLMConfig) -> int:
    """Parameters of an LSTM, GRU or RNN baseline (`t2mlr.baselines.recurrent`)."""
    return _meta_count(lambda: RecurrentLMForCausalLM(config))


lstm_parameter_count = recurrent_parameter_count  # the name from before the GRU and RNN baselines


def smallest_matching_width(
    t2mlr_config: T2MLRConfig, wrap: Callable[[MatchedLlamaConfig], PretrainedConfig]
) -> PretrainedConfig:
    """`wrap(the T²MLR backbone widened)` at the smallest hidden size (≥ the backbone's) whose model has at
    least T²MLR's parameter count; depth, head count, head dimension and MLP size are kept."""
    base = t2mlr_config.base_config
    target = t2mlr_parameter_count(t2mlr_config)

    def at(hidden: int) -> PretrainedConfig:
        return wrap(matched_llama_config(base, hidden))

    return at(smallest_at_least(lambda hidden: parameter_count_of_config(at(hidden)), target,
                                start=int(base.hidden_size)))


def matched_transformer_config(t2mlr_config: T2MLRConfig) -> MatchedLlamaConfig:
    """The T²MLR backbone widened to the smallest hidden size with at least T²MLR's parameter count."""
    return smallest_matching_width(t2mlr_config, lambda base: base)


def matched_looped_config(
    t2mlr_config: T2MLRConfig,
    loop_start: int | None = None,
    loop_end: int | None = None,
    loops: int = 1,
    loop_blocks: str | None = None,
) -> LoopedConfig:
    """The looped baseline (blocks loop_start..loop_end, 1-based inclusive, or `loop_blocks` "full" /
    "S-E", run `loops` times) on the T²MLR backbone widened to match T²MLR's parameter count."""
    settings = dict(loop_blocks=loop_blocks, loop_start=loop_start, loop_end=loop_end, loops=loops)
    LoopedConfig.from_base(t2mlr_config.base_config, **settings)  # bad loop fields fail before the width search
    return smallest_matching_width(t2mlr_config, lambda base: LoopedConfig.from_base(base, **settings))


def matched_pause_config(t2mlr_config: T2MLRConfig, pauses: int) -> PauseConfig:
    """The pause-token baseline (`pauses` pauses after every token: ×(pauses + 1)) on the T²MLR backbone
    widened to match T²MLR's parameter count, the pause embeddings included."""
    PauseConfig.from_base(t2mlr_config.base_config, pauses=pauses)  # bad pause fields fail before the search
    return smallest_matching_width(t2mlr_config, lambda base: PauseConfig.from_base(base, pauses=pauses))


def matched_recurrent_config(cell: str, vocab_size: int, target: int, num_layers: int = 4,
                             **config_kwargs: object) -> RecurrentLMConfig:
    """The recurrent baseline of `cell` ("lstm", "gru", "rnn") with the smallest hidden size whose parameter
    count is at least `target`."""
    config_class = recurrent_config_class(cell)

    def build(hidden: int) -> RecurrentLMConfig:
        return config_class(vocab_size=vocab_size, hidden_size=hidden, num_layers=num_layers, **config_kwargs)

    hidden = smallest_at_least(lambda h: recurrent_parameter_count(build(h)), target)
    return build(hidden)


def matched_recurrent_baseline(t2mlr_config: T2MLRConfig, cell: str, num_layers: int = 4) -> RecurrentLMConfig:
    """The `cell` baseline ("lstm", "gru", "rnn") of `num_layers` layers on T²MLR's vocabulary and special token
    ids, at the smallest width whose parameter count reaches T²MLR's."""
    base: PretrainedConfig = t2mlr_config.base_config
    special = {name: getattr(base, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    return matched_recurrent_config(cell, int(base.vocab_size), t2mlr_parameter_count(t2mlr_config), num_layers,
                                    **special)


@dataclass(frozen=True)
class MatchedSet:
    """A T²MLR config, its matched Transformer and its matched recurrent baselines (by cell: "lstm", "gru",
    "rnn"), with every parameter count."""

    t2mlr: T2MLRConfig
    transformer: MatchedLlamaConfig
    recurrent: dict[str, RecurrentLMConfig]
    t2mlr_params: int
    transformer_params: int
    recurrent_params: dict[str, int]

    @property
    def lstm(self) -> RecurrentLMConfig:
        return self.recurrent["lstm"]

    @property
    def lstm_params(self) -> int:
        return self.recurrent_params["lstm"]

    def rows(self) -> list[tuple[str, int, int]]:
        """(model, hidden size, parameters) for printing side by side."""
        return [
            ("T²MLR", self.t2mlr.hidden_size, self.t2mlr_params),
            ("Transformer (matched)", self.transformer.hidden_size, self.transformer_params),
            *((f"{config.cell_label} (matched)", config.hidden_size, self.recurrent_params[cell])
              for cell, config in self.recurrent.items()),
        ]


def matched_models(t2mlr_config: T2MLRConfig, lstm_layers: int = 4) -> MatchedSet:
    """Every plain baseline for `t2mlr_config`, matched to its parameter count: the Transformer and the LSTM,
    GRU and RNN (each of `lstm_layers` layers)."""
    transformer = matched_transformer_config(t2mlr_config)
    recurrent = {cell: matched_recurrent_baseline(t2mlr_config, cell, lstm_layers) for cell in RECURRENT_CELLS}
    return MatchedSet(
        t2mlr=t2mlr_config,
        transformer=transformer,
        recurrent=recurrent,
        t2mlr_params=t2mlr_parameter_count(t2mlr_config),
        transformer_params=transformer_parameter_count(transformer),
        recurrent_params={cell: recurrent_parameter_count(config) for cell, config in recurrent.items()},
    )


# ---------------------------------------------------------------------------------------------- comparisons

MODEL_SPEC_FORMS = ("t2mlr:S-E, t2mlr:S-E:exact, t2mlr:S-E:jacobi:F:B, looped:full:K, looped:S-E:K, "
                    "pause:P (×P: P − 1 pauses per token), transformer or transformer:compute-matched")
COMPUTE_MATCHED = "compute-matched"  # the matched Transformer trained for T²MLR's measured training compute


@dataclass(frozen=True)
class ModelSpec:
    """One arm of a comparison as the command line names it (blocks 1-based, inclusive).

    kind "t2mlr": T²MLR(start, end) on the base shape, optionally with its own training path
    (`train_recurrence` "exact", or "jacobi" at `d_forward` / `d_backward`; None: the experiment's path);
    "looped": `loop_blocks` ("full" or "S-E") run `loops` times; "pause": ×`period`, i.e. period − 1
    pause tokens after every real token; "transformer": the parameter-matched Transformer, with
    `budget` "compute-matched" when it trains for T²MLR's measured training compute instead of the
    experiment's Transformer steps (the model is the same; only its step count differs).
    """

    kind: str
    start: int | None = None
    end: int | None = None
    loop_blocks: str | None = None
    loops: int | None = None
    period: int | None = None
    train_recurrence: str | None = None
    d_forward: int | None = None
    d_backward: int | None = None
    budget: str | None = None

    @property
    def name(self) -> str:
        """The spelling `parse_model_spec` reads back, e.g. "looped:9-22:3", "t2mlr:1-2:jacobi:16:4"."""
        return self._form(0) + (f":{self.budget}" if self.budget is not None else "")

    @property
    def dir_name(self) -> str:
        """The spelling as a directory name ("looped:9-22:3" → "looped_9-22_3")."""
        return self.name.replace(":", "_")

    @property
    def label(self) -> str:
        """How tables name the arm, e.g. "T²MLR(13,18)", "T²MLR(1,2), Jacobi (16, 4) training", "pause ×2"."""
        if self.budget is not None:
            return f"Transformer ({self.budget})"
        return self._form(1)

    def path_settings(self) -> dict[str, object]:
        """The T2MLRConfig fields this spelling sets (empty when it leaves the training path to the experiment)."""
        if self.train_recurrence is None:
            return {}
        if self.train_recurrence == "exact":
            return {"train_recurrence": "exact"}
        return {"train_recurrence": "jacobi", "d_forward": self.d_forward, "d_backward": self.d_backward}

    def _form(self, which: int) -> str:
        """The kind's spelling (0) or table label (1), with the training path's suffix."""
        path = _PATH_FORMS.get(self.train_recurrence, ("", ""))
        return (_SPEC_FORMS[self.kind][which] + path[which]).format(**vars(self))


_SPEC_FORMS = {  # kind: (command-line spelling, table label), before any training-path or budget suffix
    "t2mlr": ("t2mlr:{start}-{end}", "T²MLR({start},{end})"),
    "looped": ("looped:{loop_blocks}:{loops}", "looped {loop_blocks} ×{loops}"),
    "pause": ("pause:{period}", "pause ×{period}"),
    "transformer": ("transformer", "Transformer (matched)"),
}
_PATH_FORMS = {  # train_recurrence: (spelling suffix, label suffix); None (the experiment's path) adds none
    "exact": (":exact", ", exact training"),
    "jacobi": (":jacobi:{d_forward}:{d_backward}", ", Jacobi ({d_forward}, {d_backward}) training"),
}


def _positive_int(text: str, what: str, spec: str, minimum: int = 1) -> int:
    if not text.strip().isdigit() or int(text) < minimum:
        raise ValueError(f"{what} in {spec!r} must be an integer >= {minimum}, got {text!r}")
    return int(text)


def parse_placement(text: str) -> ModelSpec:
    """A T²MLR placement "S,E" or "S-E" (1-based, inclusive) → ModelSpec("t2mlr", S, E)."""
    parts = text.replace("-", ",").split(",")
    if len(parts) != 2:
        raise ValueError(f"a T²MLR placement is S,E or S-E (1-based, inclusive blocks, e.g. 13,18), got {text!r}")
    start, end = (_positive_int(part, "a block number", text) for part in parts)
    return ModelSpec("t2mlr", start=start, end=end)


def parse_t2mlr_spec(text: str) -> ModelSpec:
    """"S-E", "S-E:exact" or "S-E:jacobi:F:B" (T²MLR(S, E) trained on that path; 1 <= B <= F)."""
    placement, _, path = text.partition(":")
    spec = parse_placement(placement)
    if not path:
        return spec
    kind, _, depths = path.partition(":")
    if kind == "exact" and not depths:
        return replace(spec, train_recurrence="exact")
    if kind == "jacobi":
        forward, sep, backward = depths.partition(":")
        if not sep or ":" in backward:
            raise ValueError(f"a Jacobi-trained T²MLR is t2mlr:S-E:jacobi:F:B (d_forward F, d_backward B, e.g. "
                             f"t2mlr:1-2:jacobi:16:4), got 't2mlr:{text}'")
        d_forward = _positive_int(forward, "d_forward F", f"t2mlr:{text}")
        d_backward = _positive_int(backward, "d_backward B", f"t2mlr:{text}")
        if d_backward > d_forward:
            raise ValueError(f"'t2mlr:{text}': d_backward {d_backward} must not exceed d_forward {d_forward}")
        return replace(spec, train_recurrence="jacobi", d_forward=d_forward, d_backward=d_backward)
    raise ValueError(f"unknown training path in 't2mlr:{text}': use t2mlr:S-E:exact or t2mlr:S-E:jacobi:F:B")


def parse_looped_spec(text: str) -> ModelSpec:
    """"full:K" or "S-E:K" (K loops of the 1-based, inclusive blocks S..E) → ModelSpec("looped", ...)."""
    blocks, sep, loops = text.rpartition(":")
    if not sep or not blocks:
        raise ValueError(f"a looped model is full:K or S-E:K (e.g. full:2, 9-22:3), got {text!r}")
    if blocks != "full":
        parse_loop_blocks(blocks, num_layers=0)  # the form only; the range is checked against the base shape
    return ModelSpec("looped", loop_blocks=blocks, loops=_positive_int(loops, "the loop count K", text))


def parse_pause_spec(text: str) -> ModelSpec:
    """"P": the ×P pause-token model (P − 1 pause tokens after every real token; P >= 2)."""
    return ModelSpec("pause", period=_positive_int(text, "the multiplier P (P − 1 pauses per token)", text, 2))


def parse_transformer_spec(text: str) -> ModelSpec:
    """"compute-matched": the matched Transformer trained for T²MLR's measured training compute."""
    if text != COMPUTE_MATCHED:
        raise ValueError(f"unknown model 'transformer:{text}': a Transformer arm is transformer or "
                         f"transformer:{COMPUTE_MATCHED}")
    return ModelSpec("transformer", budget=COMPUTE_MATCHED)


def parse_model_spec(text: str) -> ModelSpec:
    """One of the `MODEL_SPEC_FORMS`."""
    kind, _, rest = text.strip().partition(":")
    parsers = {"t2mlr": parse_t2mlr_spec, "looped": parse_looped_spec, "pause": parse_pause_spec,
               "transformer": parse_transformer_spec}
    if kind == "transformer" and not rest:
        return ModelSpec("transformer")
    if kind not in parsers or not rest:
        raise ValueError(f"unknown model {text!r}; models are {MODEL_SPEC_FORMS}")
    return parsers[kind](rest)


def parse_model_specs(text: str) -> list[ModelSpec]:
    """A comma-separated list of `parse_model_spec` forms (T²MLR placements use '-' inside a spec)."""
    specs = [parse_model_spec(part) for part in text.split(",") if part.strip()]
    if not specs:
        raise ValueError(f"no models named; models are {MODEL_SPEC_FORMS}")
    return specs


@dataclass(frozen=True)
class Arm:
    """One built arm of a comparison: its spec, its config and its exact parameter count."""

    spec: ModelSpec
    config: PretrainedConfig
    parameters: int

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)  # wrapper configs report their base decoder's width


def matched_arms(
    base_config: PretrainedConfig, specs: list[ModelSpec], **t2mlr_settings: object
) -> tuple[int, list[Arm]]:
    """T²MLR's parameter count on `base_config` and every arm's config: T²MLR placements on the base
    itself (with `t2mlr_settings`, T2MLRConfig fields such as d_forward), the other arms at the width
    matched to T²MLR (the fusion adds 5d² + 3d + 2 parameters whatever the placement, so one target
    serves every placement)."""
    reference = T2MLRConfig.from_base(base_config, l_start=1, l_end=1)
    target = t2mlr_parameter_count(reference)
    arms = []
    for spec in specs:
        config = _arm_config(spec, base_config, reference, t2mlr_settings)
        arms.append(Arm(spec, config, parameter_count_of_config(config)))
    return target, arms


def _arm_config(
    spec: ModelSpec, base_config: PretrainedConfig, reference: T2MLRConfig, t2mlr_settings: dict[str, object]
) -> PretrainedConfig:
    if spec.kind == "t2mlr":
        settings = {**t2mlr_settings, **spec.path_settings()}
        return T2MLRConfig.from_base(base_config, l_start=spec.start, l_end=spec.end, **settings)
    if spec.kind == "looped":
        return matched_looped_config(reference, loop_blocks=spec.loop_blocks, loops=spec.loops)
    if spec.kind == "pause":
        return matched_pause_config(reference, pauses=spec.period - 1)
    if spec.kind == "transformer":
        return matched_transformer_config(reference)
    raise ValueError(f"unknown model kind {spec.kind!r}; models are {MODEL_SPEC_FORMS}")
