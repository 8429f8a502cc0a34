"""Paper experiments run end to end (`t2mlr experiment …`).

`s5_retrieval.run_experiment`: S5-Retrieval, T²MLR vs parameter-matched Transformer and LSTM, with the
presets in `s5_presets` (paper / cpu / tiny). Heavy imports (the trainer) happen on use, so importing
this package stays cheap.
"""

import importlib
from typing import Any

__all__ = ["PRESETS", "S5Preset", "get_preset"]


def __getattr__(name: str) -> Any:
    """The S5 presets on first access (PEP 562): `t2mlr experiment --help` stays light."""
    if name in __all__:
        return getattr(importlib.import_module("t2mlr.experiments.s5_presets"), name)
    raise AttributeError(f"module 't2mlr.experiments' has no attribute {name!r}")
