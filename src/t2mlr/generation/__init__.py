"""Generation with T²MLR: text generation with a chosen prefill path, the `t2mlr generate` command, and
the parameter-matched baseline used by the decoding benchmark (`matching`)."""

from .loading import ModelDirectoryError, load_model, load_tokenizer
from .matching import matched_baseline_config, matched_hidden_size
from .text import GenerationSettings, generate_kwargs, generate_text

__all__ = [
    "GenerationSettings",
    "ModelDirectoryError",
    "generate_kwargs",
    "generate_text",
    "load_model",
    "load_tokenizer",
    "matched_baseline_config",
    "matched_hidden_size",
]
