"""Loading a saved model directory (weights + tokenizer) for generation, with errors that say what is missing.

A T²MLR directory is what `save_pretrained` writes for the model plus what `save_pretrained` writes for
its tokenizer. Training runs that save only weights produce directories that load as models but cannot
turn a prompt into token ids; that case gets its own message instead of transformers' generic one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import t2mlr  # noqa: F401  (registers the "t2mlr" model type with the Auto classes)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")


class ModelDirectoryError(ValueError):
    """A model directory lacks something generation or evaluation needs."""


def resolve_device(device: str) -> torch.device:
    """"auto" picks CUDA when present, else CPU; anything else is passed to torch as is."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype | str:
    """"auto" keeps the dtype the checkpoint was saved in."""
    if dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def check_model_dir(model_dir: str | Path) -> Path:
    """The directory as a Path, after checking it holds a model config."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelDirectoryError(f"model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelDirectoryError(f"{str(path)!r} has no config.json: not a saved model (use save_pretrained)")
    return path


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside the model; a clear error when none was saved."""
    path = check_model_dir(model_dir)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelDirectoryError(
            f"{str(path)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one with "
            "tokenizer.save_pretrained(MODEL_DIR) next to the model weights"
        )
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ModelDirectoryError(f"could not load the tokenizer saved in {str(path)!r}: {err}") from err


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto") -> PreTrainedModel:
    """The saved causal LM (T²MLR or a plain transformers model), in eval mode on `device`."""
    path = check_model_dir(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
    return model.to(resolve_device(device)).eval()
