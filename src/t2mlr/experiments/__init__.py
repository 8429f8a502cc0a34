"""Paper experiments run end to end (`t2mlr experiment …`).

`s5_retrieval.run_experiment`: S5-Retrieval, T²MLR vs parameter-matched Transformer and LSTM, with the
presets in `s5_presets` (paper / cpu / tiny). Heavy imports (the trainer) happen on use, so importing
this package stays cheap.
"""

from t2mlr.experiments.s5_presets import PRESETS, S5Preset, get_preset

__all__ = ["PRESETS", "S5Preset", "get_preset"]
