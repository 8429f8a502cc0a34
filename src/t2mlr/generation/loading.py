"""Loading a saved model directory for generation and evaluation, with errors that say what is missing.

A T²MLR directory is what `save_pretrained` writes for the model plus what `save_pretrained` writes for
its tokenizer; the tokenizer loads with `t2mlr.utils.load_tokenizer`, whose error names a directory
that holds none.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import t2mlr.model  # noqa: F401  (registers the "t2mlr" model type with the Auto classes)
from t2mlr.utils import resolve_device, resolve_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["ModelDirectoryError", "check_model_dir", "load_model"]


class ModelDirectoryError(ValueError):
    """A model directory lacks something generation or evaluation needs."""


def check_model_dir(model_dir: str | Path) -> Path:
    """The directory as a Path, after checking it holds a model config."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelDirectoryError(f"model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelDirectoryError(f"{str(path)!r} has no config.json: not a saved model (use save_pretrained)")
    return path


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto") -> PreTrainedModel:
    """The saved causal LM (T²MLR or a plain transformers model), in eval mode on `device`."""
    from transformers import AutoModelForCausalLM  # here: check_model_dir answers before transformers loads

    path = check_model_dir(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
    return model.to(resolve_device(device)).eval()
