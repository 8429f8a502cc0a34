"""Loading a saved model directory for generation and evaluation, with errors that say what is missing.

A T²MLR directory is what `save_pretrained` writes for the model plus what `save_pretrained` writes for
its tokenizer; the tokenizer loads with `t2mlr.utils.load_tokenizer`, whose error names a directory
that holds none. The directory's own check (`t2mlr.utils.check_model_dir`) is light, so commands answer a missing
directory before torch loads.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, PreTrainedModel

import t2mlr.model  # noqa: F401  (registers the "t2mlr" model type with the Auto classes)
from t2mlr.utils import ModelDirectoryError, check_model_dir, resolve_device, resolve_dtype

__all__ = ["ModelDirectoryError", "check_model_dir", "load_model"]


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto") -> PreTrainedModel:
    """The saved causal LM (T²MLR or a plain transformers model), in eval mode on `device`."""
    path = check_model_dir(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
    return model.to(resolve_device(device)).eval()
