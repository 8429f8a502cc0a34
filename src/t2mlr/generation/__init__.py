"""Generation with T²MLR: text generation with a chosen prefill path (`text`), the `t2mlr generate`
command (`commands`), and loading saved model directories (`loading`)."""

from .loading import ModelDirectoryError, load_model
from .text import GenerationSettings, generate_kwargs, generate_text

__all__ = [
    "GenerationSettings",
    "ModelDirectoryError",
    "generate_kwargs",
    "generate_text",
    "load_model",
]
