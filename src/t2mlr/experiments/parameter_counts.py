"""`t2mlr params`: parameter counts of T²MLR and its matched baselines, side by side.

    t2mlr params                      # every preset
    t2mlr params --preset smollm2-135m

Presets: SmolLM2-135M with T²MLR(13, 18) (the paper's main placement; built from its published shape,
no download) and the S5-Retrieval models (`s5-tiny`, `s5-cpu`, `s5-paper`, from
`t2mlr.experiments.s5_presets`). Counts are exact: meta-device builds of the real modules.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen when the command runs, not when the CLI starts
    from t2mlr.baselines.matching import MatchedSet
    from t2mlr.model import T2MLRConfig

__all__ = ["PARAM_PRESETS", "main", "register"]


def _s5_config(name: str) -> Callable[[], "T2MLRConfig"]:
    def build() -> "T2MLRConfig":
        from t2mlr.experiments.s5_presets import get_preset, t2mlr_config
        from t2mlr.tasks.tokenizers import build_s5_tokenizer

        preset = get_preset(name)
        return t2mlr_config(preset, len(build_s5_tokenizer(preset.k, preset.alphabet)))

    return build


def _smollm2_135m() -> "T2MLRConfig":
    from t2mlr.model.shapes import smollm2_135m_t2mlr_config

    return smollm2_135m_t2mlr_config()


PARAM_PRESETS: dict[str, Callable[[], "T2MLRConfig"]] = {
    "s5-tiny": _s5_config("tiny"),
    "s5-cpu": _s5_config("cpu"),
    "s5-paper": _s5_config("paper"),
    "smollm2-135m": _smollm2_135m,
}


def format_table(name: str, matched: "MatchedSet") -> str:
    """A plain-text table: model, hidden size, parameters, ratio to T²MLR."""
    cfg = matched.t2mlr
    lines = [f"{name}: T²MLR({cfg.l_start},{cfg.l_end}) on {cfg.num_layers} blocks, vocab {cfg.vocab_size}"]
    lines.append(f"  {'model':<24}{'hidden':>8}{'parameters':>15}{'× T²MLR':>10}")
    for model, hidden, count in matched.rows():
        lines.append(f"  {model:<24}{hidden:>8}{count:>15,}{count / matched.t2mlr_params:>10.4f}")
    return "\n".join(lines)


def run_params(args: argparse.Namespace) -> int:
    from t2mlr.baselines.matching import matched_models

    names = list(PARAM_PRESETS) if args.preset == "all" else [args.preset]
    tables = [format_table(name, matched_models(PARAM_PRESETS[name]())) for name in names]
    print("\n\n".join(tables))
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `params` to a main CLI's subparsers; the handler returns an exit code."""
    parser = subparsers.add_parser(
        "params", help="parameter counts of T²MLR and its matched Transformer and LSTM",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=("all", *PARAM_PRESETS), default="all", help="model shape (default: all)")
    parser.set_defaults(func=run_params)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `params` standalone: `python -m t2mlr.experiments.parameter_counts params`."""
    from t2mlr.utils import run_registered

    return run_registered(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
