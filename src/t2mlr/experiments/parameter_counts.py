"""`t2mlr params`: parameter counts of T²MLR and its matched baselines, side by side.

    t2mlr params                      # every preset
    t2mlr params --preset smollm2-135m
    t2mlr params --base smollm2-135m --t2mlr 13,18 --looped full:2 --looped 9-22:3 --pause 2

Presets: SmolLM2-135M with T²MLR(13, 18) (the paper's main placement; built from its published shape,
no download) and the S5-Retrieval models (`s5-tiny`, `s5-cpu`, `s5-paper`, from
configs/experiments/s5_*.yaml); each shows T²MLR, the matched Transformer and the matched LSTM, GRU and
vanilla RNN (4 layers each).

Arms on a named base shape (`--base`, from `t2mlr.model.shapes`): any number of T²MLR placements
(`--t2mlr S,E`), looped models (`--looped full:K` loops every block K times, `--looped S-E:K` blocks
S..E) and pause-token models (`--pause P`: the ×P model, P − 1 pause tokens after every real token, so
the paper's ×2 is `--pause 2`; its config field `pauses` is P − 1), next to the matched Transformer.
Blocks are 1-based and inclusive. Every baseline gets the smallest width whose count reaches T²MLR's
(the same for every placement). Counts are exact: meta-device builds of the real modules.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy imports happen when the command runs, not when the CLI starts
    from t2mlr.baselines.matching import MatchedSet, ModelSpec
    from t2mlr.model import T2MLRConfig

__all__ = ["PARAM_PRESETS", "main", "preset_model", "register"]


PARAM_PRESETS = ("s5-tiny", "s5-cpu", "s5-paper", "smollm2-135m")  # named here so --help needs no torch


def preset_model(name: str) -> "T2MLRConfig":
    """The T²MLR config of a `--preset`: an S5 experiment preset's model, or T²MLR(13,18) on SmolLM2-135M."""
    if name.startswith("s5-"):
        from t2mlr.experiments.s5 import t2mlr_config

        return t2mlr_config(name.removeprefix("s5-"))
    from t2mlr.model.shapes import smollm2_135m_t2mlr_config

    return smollm2_135m_t2mlr_config()


SHAPE_NAMES = ("smollm2-135m", "smollm2-360m", "smollm2-1b")  # t2mlr.model.shapes.SHAPES, named here so --help needs no torch


def format_table(title: str, rows: list[tuple[str, int, int]], target: int) -> str:
    """A plain-text table under `title`: model, hidden size, parameters, ratio to T²MLR's count."""
    lines = [title, f"  {'model':<24}{'hidden':>8}{'parameters':>15}{'× T²MLR':>10}"]
    for model, hidden, count in rows:
        lines.append(f"  {model:<24}{hidden:>8}{count:>15,}{count / target:>10.4f}")
    return "\n".join(lines)


def preset_table(name: str, matched: "MatchedSet") -> str:
    cfg = matched.t2mlr
    title = f"{name}: T²MLR({cfg.l_start},{cfg.l_end}) on {cfg.num_layers} blocks, vocab {cfg.vocab_size}"
    return format_table(title, matched.rows(), matched.t2mlr_params)


def arms_table(shape: str, specs: list["ModelSpec"]) -> str:
    """T²MLR placements and baselines on a named shape, each baseline matched to T²MLR, plus the matched
    Transformer; ValueError for a spec the shape cannot hold (e.g. blocks past its depth)."""
    from t2mlr.baselines.matching import ModelSpec, matched_arms
    from t2mlr.model.shapes import base_config_for_shape

    base = base_config_for_shape(shape)
    if not any(spec.kind == "transformer" for spec in specs):
        specs = [*specs, ModelSpec("transformer")]
    target, arms = matched_arms(base, specs)
    title = (f"{shape}: {base.num_hidden_layers} blocks, hidden {base.hidden_size}, vocab {base.vocab_size}; "
             f"baselines matched to T²MLR's {target:,} parameters (the same for every placement)")
    return format_table(title, [(arm.spec.label, arm.hidden_size, arm.parameters) for arm in arms], target)


def run_params(args: argparse.Namespace) -> int:
    specs = [*args.t2mlr, *args.looped, *args.pause]
    if specs or args.base is not None:
        if args.preset is not None:
            return _usage_error("--preset prints a preset's own models; it cannot be combined with --base or arms")
        try:
            print(arms_table(args.base or SHAPE_NAMES[0], specs))
        except ValueError as err:
            return _usage_error(str(err))
        return 0
    from t2mlr.baselines.matching import matched_models

    names = list(PARAM_PRESETS) if args.preset in (None, "all") else [args.preset]
    print("\n\n".join(preset_table(name, matched_models(preset_model(name))) for name in names))
    return 0


def _usage_error(message: str) -> int:
    print(f"t2mlr params: error: {message}", file=sys.stderr)
    return 2


def _spec_argument(kind: str) -> Callable[[str], "ModelSpec"]:
    """An argparse `type` that parses one spec; a bad spec exits 2 with the parser's own message."""

    def parse(text: str) -> "ModelSpec":
        from t2mlr.baselines import matching

        parser = {"t2mlr": matching.parse_placement, "looped": matching.parse_looped_spec,
                  "pause": matching.parse_pause_spec}[kind]
        try:
            return parser(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err

    return parse


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `params` to a main CLI's subparsers; the handler returns an exit code."""
    parser = subparsers.add_parser(
        "params",
        help="parameter counts of T²MLR and its matched Transformer, LSTM, GRU, RNN, looped and pause-token models",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=("all", *PARAM_PRESETS), default=None,
                        help="a preset's T²MLR, matched Transformer, LSTM, GRU and RNN (default without --base: all)")
    parser.add_argument("--base", choices=SHAPE_NAMES, default=None,
                        help="named base shape for the arms below (default with arms: smollm2-135m)")
    parser.add_argument("--t2mlr", action="append", default=[], type=_spec_argument("t2mlr"), metavar="S,E",
                        help="a T²MLR placement, blocks S..E (1-based, inclusive); repeatable")
    parser.add_argument("--looped", action="append", default=[], type=_spec_argument("looped"),
                        metavar="full:K|S-E:K", help="a looped model: every block (full) or blocks S..E run K "
                        "times per token; repeatable")
    parser.add_argument("--pause", action="append", default=[], type=_spec_argument("pause"), metavar="P",
                        help="the ×P pause-token model: P − 1 pause tokens after every real token (the paper's "
                        "×2 is --pause 2; config field pauses = P − 1); repeatable")
    parser.set_defaults(func=run_params)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `params` standalone: `python -m t2mlr.experiments.parameter_counts params`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
